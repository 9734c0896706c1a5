//! Appending and reading run events.

use serde_json::{Map, json};
use subflow_contracts::NewEvent;
use subflow_store::{Error, EventQuery, EventStore};

use crate::harness::{TestDb, event, task_event};

fn seqs(events: &[subflow_contracts::RunEvent]) -> Vec<i64> {
    events.iter().map(|e| e.seq).collect()
}

#[tokio::test]
async fn seq_is_thread_global_and_strictly_increasing_across_runs() {
    let db = TestDb::new().await;
    let store = &db.store;
    let first: Vec<NewEvent> = (0..3)
        .map(|n| event("t1", "r1", "run.start", json!(n)))
        .collect();
    let second: Vec<NewEvent> = (0..2)
        .map(|n| event("t1", "r2", "run.start", json!(n)))
        .collect();
    let third: Vec<NewEvent> = (3..5)
        .map(|n| event("t1", "r1", "run.end", json!(n)))
        .collect();
    for batch in [&first, &second, &third] {
        assert_eq!(store.append(batch).await.unwrap().written, batch.len());
    }
    store
        .append(&[event("t2", "r9", "run.start", json!(0))])
        .await
        .unwrap();

    let r1 = store
        .list_events(&EventQuery::run("t1", "r1"))
        .await
        .unwrap();
    let r2 = store
        .list_events(&EventQuery::run("t1", "r2"))
        .await
        .unwrap();
    assert_eq!(seqs(&r1), [1, 2, 3, 6, 7]);
    assert_eq!(seqs(&r2), [4, 5]);
    let contents: Vec<_> = r1.iter().map(|e| e.content.clone()).collect();
    assert_eq!(
        contents,
        [json!(0), json!(1), json!(2), json!(3), json!(4)],
        "seq order is batch order"
    );
    // Another thread numbers from 1 on its own.
    let other = store
        .list_events(&EventQuery::run("t2", "r9"))
        .await
        .unwrap();
    assert_eq!(seqs(&other), [1]);
}

#[tokio::test]
async fn appending_the_same_batch_twice_writes_nothing_the_second_time() {
    let db = TestDb::new().await;
    let store = &db.store;
    let batch: Vec<NewEvent> = (0..4)
        .map(|n| event("t1", "r1", "run.start", json!(n)))
        .collect();
    let first = store.append(&batch).await.unwrap();
    assert_eq!((first.written, first.skipped), (4, 0));
    let again = store.append(&batch).await.unwrap();
    assert_eq!((again.written, again.skipped), (0, 4));
    assert_eq!(db.count_events("t1").await, 4);

    // A partly stored batch writes only the new records, numbered right after the last
    // seq like the reference store does, and a repeated id within a batch counts once.
    let fresh = event("t1", "r1", "run.end", json!("new"));
    let overlap = [batch[3].clone(), fresh.clone(), fresh.clone()];
    let outcome = store.append(&overlap).await.unwrap();
    assert_eq!((outcome.written, outcome.skipped), (1, 2));
    let events = store
        .list_events(&EventQuery::run("t1", "r1"))
        .await
        .unwrap();
    assert_eq!(seqs(&events), [1, 2, 3, 4, 5]);
    assert_eq!(events[4].event_id, fresh.event_id);
}

#[tokio::test]
async fn the_task_filter_applies_before_the_limit() {
    let db = TestDb::new().await;
    let store = &db.store;
    // Task b's records sit after many of task a's, so limiting before filtering would
    // return fewer than three.
    let mut batch: Vec<NewEvent> = (0..10)
        .map(|n| task_event("t1", "r1", "task-a", n))
        .collect();
    batch.extend((10..15).map(|n| task_event("t1", "r1", "task-b", n)));
    let numeric_task = serde_json::Map::from_iter([("task_id".to_owned(), json!(7))]);
    batch.push(NewEvent::new(
        "t1",
        "r1",
        "subagent.step",
        "subagent",
        json!(null),
        numeric_task,
    ));
    store.append(&batch).await.unwrap();

    let query = EventQuery {
        task_id: Some("task-b".to_owned()),
        limit: 3,
        ..EventQuery::run("t1", "r1")
    };
    let page = store.list_events(&query).await.unwrap();
    assert_eq!(seqs(&page), [11, 12, 13]);
    assert!(page.iter().all(|e| e.metadata["task_id"] == "task-b"));

    // Only string task ids are indexed, as `EventQuery::matches` defines.
    let query = EventQuery {
        task_id: Some("7".to_owned()),
        ..EventQuery::run("t1", "r1")
    };
    assert!(store.list_events(&query).await.unwrap().is_empty());
}

#[tokio::test]
async fn invalid_batches_are_rejected_whole_and_write_nothing() {
    let db = TestDb::new().await;
    let store = &db.store;
    let good = || event("t1", "r1", "run.start", json!(null));

    let long_type = event("t1", "r1", &"x".repeat(33), json!(null));
    let err = store.append(&[good(), long_type]).await.unwrap_err();
    assert!(matches!(err, Error::InvalidEventType(_)), "{err}");

    let err = store
        .append(&[good(), event("t2", "r1", "run.start", json!(null))])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MixedThreads { .. }), "{err}");

    let err = store
        .append(&[event("bad id!", "r1", "run.start", json!(null))])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidThreadId(_)), "{err}");

    let mut no_run = good();
    no_run.run_id.clear();
    let err = store.append(&[good(), no_run]).await.unwrap_err();
    assert!(matches!(err, Error::InvalidRunId), "{err}");
    assert!(err.is_invalid_input());

    assert_eq!(db.count_events("t1").await, 0);
    assert_eq!(db.count_events("t2").await, 0);
    assert_eq!(store.append(&[]).await.unwrap(), Default::default());
}

#[tokio::test]
async fn type_filter_cursor_and_scope_select_the_page() {
    let db = TestDb::new().await;
    let store = &db.store;
    let types = [
        "run.start",
        "llm.error",
        "run.start",
        "run.end",
        "llm.error",
    ];
    let batch: Vec<NewEvent> = types
        .iter()
        .enumerate()
        .map(|(n, t)| event("t1", "r1", t, json!(n)))
        .collect();
    store.append(&batch).await.unwrap();
    store
        .append(&[event("t1", "r2", "run.start", json!("other run"))])
        .await
        .unwrap();

    let by_type = EventQuery {
        event_types: Some(vec!["llm.error".to_owned(), "run.end".to_owned()]),
        ..EventQuery::run("t1", "r1")
    };
    assert_eq!(seqs(&store.list_events(&by_type).await.unwrap()), [2, 4, 5]);

    // An empty type list means no filter.
    let empty_types = EventQuery {
        event_types: Some(Vec::new()),
        ..EventQuery::run("t1", "r1")
    };
    assert_eq!(
        seqs(&store.list_events(&empty_types).await.unwrap()),
        [1, 2, 3, 4, 5]
    );

    let after = EventQuery {
        after_seq: Some(2),
        limit: 2,
        ..EventQuery::run("t1", "r1")
    };
    assert_eq!(seqs(&store.list_events(&after).await.unwrap()), [3, 4]);

    assert!(
        store
            .list_events(&EventQuery::run("t1", "nope"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .list_events(&EventQuery::run("t9", "r1"))
            .await
            .unwrap()
            .is_empty()
    );

    for bad in [
        EventQuery {
            limit: 0,
            ..EventQuery::run("t1", "r1")
        },
        EventQuery {
            limit: 2001,
            ..EventQuery::run("t1", "r1")
        },
        EventQuery {
            after_seq: Some(0),
            ..EventQuery::run("t1", "r1")
        },
    ] {
        assert!(matches!(
            store.list_events(&bad).await,
            Err(Error::InvalidQuery(_))
        ));
    }
}

#[tokio::test]
async fn records_round_trip_with_json_key_order_and_messages_are_projected() {
    let db = TestDb::new().await;
    let store = &db.store;
    let mut metadata = Map::new();
    metadata.insert("zeta".to_owned(), json!(1));
    metadata.insert("alpha".to_owned(), json!({ "y": [1, 2], "b": null }));
    let traced = NewEvent::new(
        "t1",
        "r1",
        "run.start",
        "trace",
        json!({ "z": 1, "a": 2 }),
        metadata,
    )
    .with_user(Some("user-1".to_owned()));
    let message = NewEvent::new(
        "t1",
        "r1",
        "llm.human.input",
        "message",
        json!("hi"),
        Map::new(),
    );
    store
        .append(&[traced.clone(), message.clone()])
        .await
        .unwrap();

    let events = store
        .list_events(&EventQuery::run("t1", "r1"))
        .await
        .unwrap();
    let stored = &events[0];
    assert_eq!(stored.event_id, traced.event_id);
    assert_eq!(stored.user_id.as_deref(), Some("user-1"));
    assert_eq!(
        serde_json::to_string(&stored.content).unwrap(),
        r#"{"z":1,"a":2}"#
    );
    assert_eq!(
        serde_json::to_string(&stored.metadata).unwrap(),
        r#"{"zeta":1,"alpha":{"y":[1,2],"b":null}}"#
    );
    assert_eq!(
        stored.created_at, events[1].created_at,
        "one timestamp per batch"
    );

    let messages = store.list_messages("t1").await.unwrap();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].event_id, message.event_id);
    assert_eq!(messages[0].seq, 2);
}

#[tokio::test]
async fn a_batch_larger_than_one_insert_statement_is_numbered_in_order() {
    let db = TestDb::new().await;
    let store = &db.store;
    let batch: Vec<NewEvent> = (0..2500)
        .map(|n| event("t1", "r1", "run.start", json!(n)))
        .collect();
    let outcome = store.append(&batch).await.unwrap();
    assert_eq!((outcome.written, outcome.skipped), (2500, 0));

    let mut all = Vec::new();
    let mut query = EventQuery {
        limit: 2000,
        ..EventQuery::run("t1", "r1")
    };
    loop {
        let page = store.list_events(&query).await.unwrap();
        let Some(last) = page.last() else { break };
        query.after_seq = Some(last.seq);
        all.extend(page);
    }
    assert_eq!(seqs(&all), (1..=2500).collect::<Vec<i64>>());
    assert!(all.iter().enumerate().all(|(n, e)| e.content == json!(n)));
}
