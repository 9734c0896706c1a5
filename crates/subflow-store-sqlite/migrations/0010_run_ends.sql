-- Each run's `run.end`, found at once: an append skips records of a run that has ended.
CREATE INDEX run_events_ends ON run_events (thread_id, run_id) WHERE event_type = 'run.end';
