"""How weights leave the trainer: buckets, the disk and process-group transports, the streaming export."""
