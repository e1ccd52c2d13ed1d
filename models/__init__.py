"""Models: detectors (rules, anomaly, failure-in-horizon), training, evaluation and artifacts."""
