"""What a run measures, shared by the real harness and the simulator: request records (`records`), load
points and arrival schedules (`schedule`), pure metrics from records to summaries (`metrics`), and the run
folder's summary files and plots (`report`). Imports nothing of kvbench but `distribution`.
"""
