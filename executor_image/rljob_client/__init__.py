"""Trainer-side client library: RolloutStream (Ray Client) and InferenceControllerClient."""
