-- Nothing follows a run's end: the append function skips records of a run whose
-- `run.end` is stored, whoever still writes for it (a process that lost its lease), found
-- through a partial index of the ends. Otherwise as in 0007.
CREATE INDEX run_events_ends ON run_events (thread_id, run_id) WHERE event_type = 'run.end';

DROP FUNCTION subflow_append_events(TEXT, TEXT[], UUID[], TEXT[], TEXT[], TEXT[], TEXT[],
                                    TEXT[], TEXT[], TEXT[]);

CREATE FUNCTION subflow_append_events(
    p_thread_id   TEXT,
    p_created_ats TEXT[],
    p_event_ids   UUID[],
    p_run_ids     TEXT[],
    p_types       TEXT[],
    p_categories  TEXT[],
    p_contents    TEXT[],
    p_metadata    TEXT[],
    p_task_ids    TEXT[],
    p_user_ids    TEXT[]
) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    last_seq BIGINT;
    written  BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_thread_id, 0));
    SELECT COALESCE(MAX(seq), 0) INTO last_seq FROM run_events WHERE thread_id = p_thread_id;
    -- Records already stored, or repeated in the batch, take no seq.
    WITH batch AS (
        SELECT *
        FROM UNNEST(p_event_ids, p_run_ids, p_types, p_categories, p_contents, p_metadata,
                    p_task_ids, p_user_ids, p_created_ats)
             WITH ORDINALITY AS b(event_id, run_id, event_type, category, content, metadata,
                                  task_id, user_id, created_at, ord)
    ), fresh AS (
        SELECT DISTINCT ON (event_id) *
        FROM batch
        WHERE NOT EXISTS (SELECT 1 FROM run_events r WHERE r.event_id = batch.event_id)
          AND NOT EXISTS (SELECT 1 FROM run_events r WHERE r.thread_id = p_thread_id
                          AND r.run_id = batch.run_id AND r.event_type = 'run.end')
        ORDER BY event_id, ord
    )
    INSERT INTO run_events (event_id, thread_id, run_id, seq, event_type, category, content,
                            metadata, task_id, user_id, created_at)
    SELECT event_id, p_thread_id, run_id, last_seq + ROW_NUMBER() OVER (ORDER BY ord),
           event_type, category, content, metadata, task_id, user_id, created_at
    FROM fresh
    ORDER BY ord
    ON CONFLICT (event_id) DO NOTHING;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END
$$;
