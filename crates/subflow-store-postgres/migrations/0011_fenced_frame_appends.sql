-- Lease-fenced stream appends: `subflow_append_frames` takes the writer's lease owner and
-- appends only while that owner holds the run's lease, read under FOR SHARE so a
-- recovery deleting the lease and this append are serialised. Returns -2 (nothing
-- written) when the lease is another's or gone; a NULL owner appends unfenced.
-- Otherwise as migration 0005's function: the frames written, 0 for an ended log, NULL
-- when the run does not exist in that thread, -1 for a hole after the stored end.
DROP FUNCTION subflow_append_frames(TEXT, TEXT, BIGINT[], TEXT[], TEXT[], BOOLEAN);

CREATE FUNCTION subflow_append_frames(
    p_run_id    TEXT,
    p_thread_id TEXT,
    p_ids       BIGINT[],
    p_events    TEXT[],
    p_data      TEXT[],
    p_ends      BOOLEAN,
    p_owner     TEXT
) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    v_last    BIGINT;
    v_ended   TIMESTAMPTZ;
    v_first   BIGINT;
    v_written BIGINT;
    v_holder  TEXT;
BEGIN
    INSERT INTO run_streams (run_id, thread_id)
    SELECT run_id, thread_id FROM runs WHERE run_id = p_run_id AND thread_id = p_thread_id
    ON CONFLICT (run_id) DO NOTHING;
    SELECT last_id, ended_at INTO v_last, v_ended
    FROM run_streams WHERE run_id = p_run_id AND thread_id = p_thread_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_owner IS NOT NULL THEN
        SELECT owner INTO v_holder FROM run_leases WHERE run_id = p_run_id FOR SHARE;
        IF v_holder IS DISTINCT FROM p_owner THEN
            RETURN -2;
        END IF;
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
