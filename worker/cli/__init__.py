"""The kp-scorer command line: worker, demo, score, replay, settings (entry: main.main)."""
