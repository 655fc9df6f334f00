"""The one way any process of the project talks to the Kubernetes API server.

- `kubeconfig`: whose credentials (ServiceAccount, kubeconfig files merged, exec plugins,
  cached auth-provider tokens), as the `kopf.ConnectionInfo` kopf logs in with too;
- `connection`: one API server, one HTTPS pool (urllib3), credentials renewed as they expire;
- `kubeapi`: plain-dict REST calls on a thread pool and their error tree; `api_pool`, which
  queued call a free thread serves next;
- `list_watch`: client-go's reflector (LIST, then WATCH) on the event loop (aiohttp);
- `kopf_watch`: what the operator changes inside kopf's own RLJob watch.

Only this package imports urllib3, opens aiohttp sessions to the API server or reaches into
kopf's private modules (`pyproject.toml`'s import contract, `tests/unit/test_kube_layer.py`).
"""
