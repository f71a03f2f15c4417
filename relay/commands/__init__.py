"""What the command line runs besides `run`: `status`, `checkpoint reset`, `tail`, `outbox init`.
Like relay.wiring, these read the Settings and hand each part its own configuration."""
