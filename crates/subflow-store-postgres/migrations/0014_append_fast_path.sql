-- A batch of new records is inserted as it comes. The careful statement of 0012 (an
-- anti-join on every event id, a sort to drop repeats and a sort to number what is
-- left) was a fifth of an append's time, spent on batches that almost never hold a
-- stored or repeated record. Now the batch is first inserted with seqs numbered in batch
-- order, when none of its runs has ended; if every record was written, that is the
-- answer. Otherwise (a record already stored, or repeated in the batch) the rows just
-- inserted are deleted again (the thread's advisory lock is held, so every seq after the
-- thread's last one is this call's) and the careful statement runs, as before: records
-- already stored, repeated in the batch or of an ended run take no seq.

CREATE OR REPLACE FUNCTION subflow_append_events(
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
    IF NOT EXISTS (SELECT 1 FROM run_events r WHERE r.thread_id = p_thread_id
                   AND r.event_type = 'run.end' AND r.run_id = ANY (p_run_ids)) THEN
        INSERT INTO run_events (event_id, thread_id, run_id, seq, event_type, category,
                                content, metadata, task_id, user_id, created_at)
        SELECT event_id, p_thread_id, run_id, last_seq + ord, event_type, category, content,
               metadata, task_id, user_id, created_at
        FROM UNNEST(p_event_ids, p_run_ids, p_types, p_categories, p_contents, p_metadata,
                    p_task_ids, p_user_ids, p_created_ats)
             WITH ORDINALITY AS b(event_id, run_id, event_type, category, content, metadata,
                                  task_id, user_id, created_at, ord)
        ON CONFLICT (event_id) DO NOTHING;
        GET DIAGNOSTICS written = ROW_COUNT;
        IF written = cardinality(p_event_ids) THEN
            RETURN written;
        END IF;
        DELETE FROM run_events WHERE thread_id = p_thread_id AND seq > last_seq;
    END IF;
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
