"""What the trainer and the engine builder both need; neither imports the other."""
