"""The files the package reads and writes, one module a format: training checkpoints (.npz without pickle) and the
release folder. Below every layer that reads them, so that reading a file never pulls in the code that writes it."""
