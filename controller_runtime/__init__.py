"""InferenceController core: engine cells, health, the controller lock and the weight-update window.

Pure asyncio. It talks to the world through `ports.Platform` and `ports.EngineClient` only,
so the same logic runs in the kopf operator and in local mode (import-linter keeps
kopf, kubernetes and ray out of this package).
"""
