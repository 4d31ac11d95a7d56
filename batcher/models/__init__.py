"""Models bundled with the runtime: a demo torch model and a simulated device for tests."""
