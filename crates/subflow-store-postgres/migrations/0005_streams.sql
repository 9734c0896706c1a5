-- Run stream logs, run leases and cancel requests (docs/api.md#resume-and-rejoin, docs/api.md#cancel). Every row belongs
-- to a run and goes with it: deleting a run (rollback) or its thread cascades here.
-- Lease and log times are the database server's clock, so processes on machines with
-- different clocks agree on when a lease expired.

-- One row per run that has logged a frame. `last_id` is the highest frame id ever
-- appended and survives pruning, so a cursor into pruned frames is told apart from
-- one past the end. A log with `ended_at` set takes no more frames. Appends lock this
-- row, so an owner and a process recovering the run never interleave their frames.
CREATE TABLE run_streams (
    run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    thread_id TEXT NOT NULL,
    last_id BIGINT NOT NULL DEFAULT 0,
    ended_at TIMESTAMPTZ,
    pruned BOOLEAN NOT NULL DEFAULT FALSE
);

CREATE INDEX run_streams_prunable ON run_streams (ended_at) WHERE NOT pruned;

CREATE TABLE stream_frames (
    run_id TEXT NOT NULL REFERENCES run_streams (run_id) ON DELETE CASCADE,
    id BIGINT NOT NULL,
    event TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (run_id, id)
);

CREATE TABLE run_leases (
    run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    owner TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);

CREATE INDEX run_leases_by_expiry ON run_leases (expires_at);

CREATE TABLE run_cancel_requests (
    run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    requested_at TEXT NOT NULL
);

-- Appends a batch of consecutive frames in one round trip and announces it on
-- `subflow_stream` with `{run_id, last_id}`; the NOTIFY is delivered at commit, so a
-- watcher woken by it always finds the frames. Returns the frames written, 0 for an
-- ended log, NULL when the run does not exist in that thread, and -1 (nothing written)
-- when the frames would leave a hole after the stored end.
CREATE FUNCTION subflow_append_frames(
    p_run_id    TEXT,
    p_thread_id TEXT,
    p_ids       BIGINT[],
    p_events    TEXT[],
    p_data      TEXT[],
    p_ends      BOOLEAN
) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    v_last    BIGINT;
    v_ended   TIMESTAMPTZ;
    v_first   BIGINT;
    v_written BIGINT;
BEGIN
    INSERT INTO run_streams (run_id, thread_id)
    SELECT run_id, thread_id FROM runs WHERE run_id = p_run_id AND thread_id = p_thread_id
    ON CONFLICT (run_id) DO NOTHING;
    SELECT last_id, ended_at INTO v_last, v_ended
    FROM run_streams WHERE run_id = p_run_id AND thread_id = p_thread_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF v_ended IS NOT NULL THEN
        RETURN 0;
    END IF;
    SELECT MIN(id) INTO v_first FROM UNNEST(p_ids) AS f(id) WHERE id > v_last;
    IF v_first IS NOT NULL AND v_first <> v_last + 1 THEN
        RETURN -1;
    END IF;
    INSERT INTO stream_frames (run_id, id, event, data)
    SELECT p_run_id, f.id, f.event, f.data
    FROM UNNEST(p_ids, p_events, p_data) AS f(id, event, data)
    WHERE f.id > v_last;
    GET DIAGNOSTICS v_written = ROW_COUNT;
    IF v_written > 0 THEN
        v_last := v_last + v_written;
    END IF;
    UPDATE run_streams
    SET last_id = v_last, ended_at = CASE WHEN p_ends THEN now() ELSE NULL END
    WHERE run_id = p_run_id;
    IF v_written > 0 OR p_ends THEN
        PERFORM pg_notify('subflow_stream',
                          json_build_object('run_id', p_run_id, 'last_id', v_last)::text);
    END IF;
    RETURN v_written;
END
$$;
