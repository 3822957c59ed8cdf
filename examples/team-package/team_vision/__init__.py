"""The team's models for dtrain: `classPath: team_vision.classifier.LitClassifier`."""
