"""The one root of what the trainer and executor side raise of their own.

`except RLJobError` catches every failure that `rljob_client` and `rollout_executor` raise on
purpose; each class also keeps the built-in base it had (`except ValueError` still catches a
`StateError`). The controller API's answers are the other root a trainer meets: the error
table's `ControllerAPIError` (`controller_runtime.api.wire_errors`), which the servers share.

    RLJobError
    ├── DeadlineExpired (RuntimeError)           retry_deadline: a retried call past its deadline
    ├── RayConnectError (ConnectionError)        rayconnect: Ray Client could not connect in time
    ├── RolloutStreamError (RuntimeError)        rollout_stream: the executor could not produce a shard
    ├── ActorMissing (LookupError)               rollout_stream: no executor actor (yet)
    ├── ShardChannelLost (ConnectionError)       rollout_stream: the side channel closed mid-shard
    ├── WeightTransferFailed (EngineError)       weight_broadcast: a process-group update failed
    ├── MemoryChangeFailed (ControllerError)     controller_client: offload/onload refused by an engine
    ├── WeightSyncFailed (RuntimeError)          publish: weights not pushed within the attempts
    ├── CallOrderError (RuntimeError)            job: an SDK call out of order (names the call expected)
    ├── EnvError (ValueError)                    env: the RLJOB_* environment is missing or malformed
    ├── VersionMismatch (RuntimeError)           versions: Ray or Python differ from the executor's
    ├── RankFailed (RuntimeError)                trainer.ranks: another trainer rank died or hung
    ├── CheckpointError                          trainer.checkpoint: a checkpoint that cannot be used
    ├── CheckpointSaveFailed (RuntimeError)      trainer.resume: a background save failed
    ├── FetchError                               fetch: a model or dataset that cannot be downloaded as asked
    ├── DatasetError                             rollout_executor.dataset: the dataset cannot be read
    ├── GenerationError                          rollout_executor.generation: a sample cannot be generated
    ├── EngineFailure                            rollout_executor.generation: one attempt failed (the engine)
    ├── RewardCallError                          rollout_executor.rewardpool: one call in the reward pool failed
    ├── RewardPoolStartError                     rollout_executor.rewardpool: the reward workers did not start
    ├── MalformedSample                          rollout_executor.rollout_api: a rollout function's sample is malformed
    ├── FailureBudgetExceeded                    rollout_executor.failures: too many samples of a rollout failed
    ├── RewardError                              rollout_executor.rewards: the reward function failed
    ├── StateError (ValueError)                  rollout_executor.state: a saved state that cannot be used
    ├── WeightVersionError (ValueError)          rollout_executor.staleness: a version backwards or not an integer
    └── RayStartTimedOut (RuntimeError)          rollout_executor.rayhead: the raylet did not register in time
"""

from __future__ import annotations


class RLJobError(Exception):
    """Base of everything the trainer and executor side raise on purpose."""
