//! The per-run buffer, retry queue and spill file (docs/events.md#buffering-and-durability), driven on paused time.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use subflow_contracts::task_events::map_task_event;
use subflow_contracts::{NewEvent, RunEvent};
use subflow_store::buffer::{
    BufferKind, BufferPolicy, EventBuffer, EventScope, Loan, RetryPolicy, RetryQueue, StoreCounters,
};
use subflow_store::spill::SpillFile;
use subflow_store::{
    AppendOutcome, Error, EventQuery, EventStore, MemoryStore, Result, TaskSummary,
};

/// How a [`FaultyStore`] misbehaves.
#[derive(Debug, Clone, Copy)]
enum Faults {
    /// Every 3rd write fails before writing; every 5th commits and then reports failure.
    Intermittent,
    /// Every write fails.
    Down,
}

/// A memory store that fails writes on purpose and records the size of every batch.
#[derive(Debug)]
struct FaultyStore {
    inner: MemoryStore,
    faults: Mutex<Option<Faults>>,
    calls: AtomicUsize,
    batches: Mutex<Vec<usize>>,
}

impl FaultyStore {
    fn new(faults: Option<Faults>) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner: MemoryStore::new(),
            faults: Mutex::new(faults),
            calls: AtomicUsize::new(0),
            batches: Mutex::new(Vec::new()),
        })
    }

    fn heal(&self) {
        *self.faults.lock().unwrap() = None;
    }

    fn batch_sizes(&self) -> Vec<usize> {
        self.batches.lock().unwrap().clone()
    }

    async fn run_events(&self) -> Vec<RunEvent> {
        let mut query = EventQuery::run("t1", "r1");
        query.limit = 2000;
        self.inner.list_events(&query).await.unwrap()
    }
}

fn injected() -> Error {
    Error::backend(std::io::Error::other("injected fault"))
}

#[async_trait]
impl EventStore for FaultyStore {
    async fn append(&self, batch: &[NewEvent]) -> Result<AppendOutcome> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.batches.lock().unwrap().push(batch.len());
        let faults = *self.faults.lock().unwrap();
        match faults {
            Some(Faults::Down) => Err(injected()),
            Some(Faults::Intermittent) if call.is_multiple_of(3) => Err(injected()),
            Some(Faults::Intermittent) if call.is_multiple_of(5) => {
                self.inner.append(batch).await?;
                Err(injected())
            }
            _ => self.inner.append(batch).await,
        }
    }

    async fn list_events(&self, query: &EventQuery) -> Result<Vec<RunEvent>> {
        self.inner.list_events(query).await
    }

    async fn list_messages(
        &self,
        thread_id: &str,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Vec<RunEvent>> {
        self.inner.list_messages(thread_id, before_seq, limit).await
    }

    async fn task_summaries(&self, thread_id: &str, run_id: &str) -> Result<Vec<TaskSummary>> {
        self.inner.task_summaries(thread_id, run_id).await
    }
}

struct Harness {
    store: Arc<FaultyStore>,
    buffer: EventBuffer,
    retry: RetryQueue,
    counters: Arc<StoreCounters>,
    spill: Arc<SpillFile>,
    _dir: tempfile::TempDir,
}

fn harness(faults: Option<Faults>) -> Harness {
    let store = FaultyStore::new(faults);
    let dir = tempfile::tempdir().unwrap();
    let spill = Arc::new(SpillFile::in_dir(dir.path()));
    let counters = Arc::new(StoreCounters::default());
    let retry = RetryQueue::spawn(
        store.clone(),
        spill.clone(),
        RetryPolicy::default(),
        counters.clone(),
    );
    let scope = EventScope {
        thread_id: "t1".into(),
        run_id: "r1".into(),
        user_id: Some("u1".into()),
    };
    let policy = BufferPolicy::subagent(Duration::from_millis(250));
    let buffer = EventBuffer::spawn(
        store.clone(),
        scope,
        policy,
        retry.clone(),
        counters.clone(),
    );
    Harness {
        store,
        buffer,
        retry,
        counters,
        spill,
        _dir: dir,
    }
}

/// Records a live task event as the runtime does: mapped to its `subagent.*` record.
fn record_task(buffer: &EventBuffer, chunk: &Value) -> Result<()> {
    buffer.record_mapped(map_task_event(chunk).expect("a valid task event"))
}

fn started(task: &str) -> Value {
    json!({"type": "task_started", "task_id": task, "description": "d", "model_name": "m"})
}

fn running(task: &str, index: u64) -> Value {
    json!({"type": "task_running", "task_id": task, "message_index": index, "total_messages": index,
           "message": {"type": "ai", "content": format!("step {index}"), "tool_calls": []},
           "usage": null, "model_name": "m"})
}

fn completed(task: &str) -> Value {
    json!({"type": "task_completed", "task_id": task, "result": "ok", "usage": null, "model_name": "m"})
}

/// Lets the buffer task run without moving the paused clock far.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Waits (on paused time) until nothing is pending anywhere.
async fn until_idle(counters: &StoreCounters) {
    for _ in 0..10_000 {
        if counters.pending(BufferKind::Subagent) == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "records still pending: {}",
        counters.pending(BufferKind::Subagent)
    );
}

fn emission_keys(events: &[RunEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e.event_type,
                e.content
                    .get("message_index")
                    .map_or(String::new(), Value::to_string)
            )
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn every_record_is_persisted_exactly_once_in_emission_order_despite_faults() {
    let h = harness(Some(Faults::Intermittent));
    let mut expected = vec!["subagent.start:".to_owned()];
    record_task(&h.buffer, &started("call_a")).unwrap();
    for index in 1..=300 {
        record_task(&h.buffer, &running("call_a", index)).unwrap();
        expected.push(format!("subagent.step:{index}"));
        if index % 7 == 0 {
            tokio::time::sleep(Duration::from_millis(90)).await;
        }
    }
    record_task(&h.buffer, &completed("call_a")).unwrap();
    expected.push("subagent.end:".to_owned());
    h.buffer.close().await;
    until_idle(&h.counters).await;

    let events = h.store.run_events().await;
    assert_eq!(
        emission_keys(&events),
        expected,
        "each record once, in emission order"
    );
    let ids: std::collections::HashSet<_> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), events.len());
    assert!(
        h.counters.flush_failures(BufferKind::Subagent) > 0,
        "faults were injected"
    );
    assert!(events.iter().all(|e| e.user_id.as_deref() == Some("u1")));
    assert!(!h.spill.path().exists(), "nothing needed spilling");
}

#[tokio::test(start_paused = true)]
async fn twenty_five_pending_records_flush_as_one_batch() {
    let h = harness(None);
    for index in 1..=24 {
        record_task(&h.buffer, &running("call_a", index)).unwrap();
    }
    settle().await;
    assert!(
        h.store.batch_sizes().is_empty(),
        "24 records wait for the trigger"
    );
    record_task(&h.buffer, &running("call_a", 25)).unwrap();
    settle().await;
    assert_eq!(h.store.batch_sizes(), [25]);
}

#[tokio::test(start_paused = true)]
async fn a_backlog_that_is_already_waiting_goes_out_in_the_same_batch() {
    let h = harness(None);
    for index in 1..=60 {
        record_task(&h.buffer, &running("call_a", index)).unwrap();
    }
    settle().await;
    assert_eq!(
        h.store.batch_sizes(),
        [60],
        "records sent before the flush are pending too"
    );
    let indexes: Vec<u64> = h
        .store
        .run_events()
        .await
        .iter()
        .map(|e| e.content["message_index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, (1..=60).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn a_subagent_end_flushes_at_once_together_with_earlier_steps() {
    let h = harness(None);
    record_task(&h.buffer, &started("call_a")).unwrap();
    for index in 1..=3 {
        record_task(&h.buffer, &running("call_a", index)).unwrap();
    }
    record_task(&h.buffer, &completed("call_a")).unwrap();
    settle().await;
    assert_eq!(
        h.store.batch_sizes(),
        [5],
        "one batch write, no single-record writes"
    );
    assert_eq!(h.store.run_events().await.len(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_lone_step_is_persisted_within_the_flush_interval() {
    let h = harness(None);
    record_task(&h.buffer, &running("call_a", 1)).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(h.store.run_events().await.is_empty());
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(h.store.run_events().await.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn flush_stores_what_was_recorded_before_it_and_says_whether_it_did() {
    let h = harness(Some(Faults::Down));
    record_task(&h.buffer, &running("call_a", 1)).unwrap();
    assert!(!h.buffer.flush().await, "the store is down");
    assert!(h.store.run_events().await.is_empty());
    assert_eq!(
        h.counters.pending(BufferKind::Subagent),
        1,
        "kept for the next flush"
    );
    h.store.heal();
    record_task(&h.buffer, &running("call_a", 2)).unwrap();
    assert!(h.buffer.flush().await);
    assert_eq!(
        h.store.run_events().await.len(),
        2,
        "stored at once, long before the flush interval"
    );
    assert!(h.buffer.flush().await, "nothing pending is a success");
    h.buffer.close().await;
    assert!(h.buffer.flush().await, "a closed buffer holds nothing");
}

/// The `message_index` of each stored record, in seq order.
async fn stored_indexes(store: &FaultyStore) -> Vec<u64> {
    store
        .run_events()
        .await
        .iter()
        .map(|e| e.metadata["message_index"].as_u64().unwrap())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_loan_stored_by_its_borrower_is_done_and_the_buffer_writes_nothing_meanwhile() {
    let h = harness(None);
    for index in 1..=3 {
        record_task(&h.buffer, &running("call_a", index)).unwrap();
    }
    let mut loan = Loan::default();
    h.buffer.lend_to(&mut loan).await;
    assert!(loan.complete());
    assert_eq!(loan.records().len(), 3);
    // Records after the loan wait, whatever their triggers say, until it is settled.
    for index in 4..=30 {
        record_task(&h.buffer, &running("call_a", index)).unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        h.store.batch_sizes().is_empty(),
        "nothing written while lent"
    );
    h.store.append(loan.records()).await.unwrap();
    loan.settle(true);
    assert!(h.buffer.flush().await);
    assert_eq!(
        h.store.batch_sizes(),
        [3, 27],
        "the lent records are not written again"
    );
    assert_eq!(stored_indexes(&h.store).await, (1..=30).collect::<Vec<_>>());
    assert_eq!(h.counters.pending(BufferKind::Subagent), 0);
    assert_eq!(h.counters.flushes(BufferKind::Subagent), 2);
}

#[tokio::test(start_paused = true)]
async fn a_loan_not_stored_or_dropped_leaves_the_records_ahead_of_newer_ones() {
    let h = harness(None);
    record_task(&h.buffer, &running("call_a", 1)).unwrap();
    let mut loan = Loan::default();
    h.buffer.lend_to(&mut loan).await;
    record_task(&h.buffer, &running("call_a", 2)).unwrap();
    loan.settle(false);
    let mut again = Loan::default();
    h.buffer.lend_to(&mut again).await;
    assert_eq!(
        again.records().len(),
        2,
        "the unstored record is lent again, first"
    );
    record_task(&h.buffer, &running("call_a", 3)).unwrap();
    drop(again);
    assert!(h.buffer.flush().await);
    assert_eq!(stored_indexes(&h.store).await, [1, 2, 3]);
    assert_eq!(h.counters.pending(BufferKind::Subagent), 0);
}

#[tokio::test(start_paused = true)]
async fn buffers_with_nothing_pending_lend_nothing_and_a_failed_close_says_so() {
    let h = harness(None);
    let mut loan = Loan::default();
    h.buffer.lend_to(&mut loan).await;
    assert!(loan.records().is_empty() && loan.complete());

    let down = harness(Some(Faults::Down));
    record_task(&down.buffer, &running("call_a", 1)).unwrap();
    // The close is asked for first, so the loan is answered after the final flush.
    let (closed, mut loan) = tokio::join!(down.buffer.close(), async {
        let mut loan = Loan::default();
        down.buffer.lend_to(&mut loan).await;
        loan
    });
    assert!(!closed);
    assert!(loan.records().is_empty());
    assert!(
        !loan.complete(),
        "the records a loan asked for went to the retry queue unstored"
    );
    loan = Loan::default();
    down.buffer.lend_to(&mut loan).await;
    assert!(
        loan.records().is_empty() && loan.complete(),
        "a closed buffer lends nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_is_kept_ahead_of_newer_records_and_never_raised() {
    let h = harness(Some(Faults::Down));
    for index in 1..=25 {
        record_task(&h.buffer, &running("call_a", index)).unwrap();
    }
    settle().await;
    assert_eq!(h.store.batch_sizes(), [25]);
    assert_eq!(h.counters.flush_failures(BufferKind::Subagent), 1);
    record_task(&h.buffer, &running("call_a", 26)).unwrap();
    settle().await;
    assert_eq!(
        h.store.batch_sizes(),
        [25, 26],
        "each later add retries the whole pending list"
    );
    h.store.heal();
    record_task(&h.buffer, &running("call_a", 27)).unwrap();
    settle().await;
    let indexes: Vec<u64> = h
        .store
        .run_events()
        .await
        .iter()
        .map(|e| e.content["message_index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, (1..=27).collect::<Vec<_>>());
    assert_eq!(h.counters.pending(BufferKind::Subagent), 0);
}

#[tokio::test(start_paused = true)]
async fn records_that_outlive_the_final_flush_are_spilled_and_reapplied_at_the_next_start() {
    let h = harness(Some(Faults::Down));
    record_task(&h.buffer, &started("call_a")).unwrap();
    for index in 1..=9 {
        record_task(&h.buffer, &running("call_a", index)).unwrap();
    }
    h.buffer.close().await;
    let attempts_after_close = h.store.batch_sizes().len();
    assert_eq!(
        attempts_after_close, 3,
        "the final flush and its two retries"
    );
    assert_eq!(
        h.counters.pending(BufferKind::Subagent),
        10,
        "handed to the retry queue"
    );

    // Five minutes of failed retries later, the records go to the spill file.
    tokio::time::sleep(Duration::from_secs(330)).await;
    assert_eq!(h.counters.spilled(BufferKind::Subagent), 10);
    assert_eq!(h.counters.pending(BufferKind::Subagent), 0);
    let lines = std::fs::read_to_string(h.spill.path()).unwrap();
    assert_eq!(lines.lines().count(), 10);

    // A late record after shutdown is spilled too, never dropped.
    h.retry.shutdown().await;
    record_task(&h.buffer, &completed("call_a")).unwrap();
    settle().await;
    assert_eq!(
        std::fs::read_to_string(h.spill.path())
            .unwrap()
            .lines()
            .count(),
        11
    );

    // The next start re-applies the file; a second pass finds nothing.
    let restarted = FaultyStore::new(None);
    assert_eq!(h.spill.reapply(&*restarted).await.unwrap(), 11);
    assert!(!h.spill.path().exists());
    assert_eq!(h.spill.reapply(&*restarted).await.unwrap(), 0);
    let keys = emission_keys(&restarted.run_events().await);
    assert_eq!(keys.first().map(String::as_str), Some("subagent.start:"));
    assert_eq!(keys.last().map(String::as_str), Some("subagent.end:"));
    assert_eq!(keys.len(), 11);
}

#[tokio::test]
async fn reapplying_a_spill_over_records_already_written_skips_them() {
    let dir = tempfile::tempdir().unwrap();
    let spill = SpillFile::in_dir(dir.path());
    let store = MemoryStore::new();
    let records: Vec<NewEvent> = (0..4)
        .map(|n| {
            NewEvent::new(
                "t1",
                "r1",
                "llm.error",
                "trace",
                json!(n),
                Default::default(),
            )
        })
        .collect();
    store.append(&records[..2]).await.unwrap();
    spill.append(&records).unwrap();
    assert_eq!(spill.reapply(&store).await.unwrap(), 4);
    let rows = store
        .list_events(&EventQuery::run("t1", "r1"))
        .await
        .unwrap();
    assert_eq!(
        rows.iter()
            .map(|e| e.content.as_i64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
}

#[tokio::test]
async fn a_corrupt_spill_file_is_kept_and_reported_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let spill = SpillFile::in_dir(dir.path());
    let record = NewEvent::new(
        "t1",
        "r1",
        "llm.error",
        "trace",
        json!(1),
        Default::default(),
    );
    spill.append(&[record]).unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(spill.path())
        .unwrap();
    std::fs::write(
        spill.path(),
        format!(
            "{}not json\n",
            std::fs::read_to_string(spill.path()).unwrap()
        ),
    )
    .unwrap();
    let error = spill.reapply(&MemoryStore::new()).await.unwrap_err();
    assert!(error.to_string().contains("line 2"), "{error}");
    assert!(spill.path().exists(), "nothing is lost");
}

#[tokio::test(start_paused = true)]
async fn an_invalid_record_is_refused_and_nothing_is_persisted() {
    let h = harness(None);
    let too_long = h
        .buffer
        .record(&"x".repeat(40), "trace", json!(null), Default::default());
    assert!(matches!(too_long, Err(Error::InvalidEventType(_))));
    h.buffer.close().await;
    assert!(h.store.run_events().await.is_empty());
    assert!(h.store.batch_sizes().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_final_flush_runs_when_the_producer_panics() {
    let h = harness(None);
    let buffer = h.buffer.clone();
    drop(h.buffer);
    let panicked = AtomicBool::new(false);
    let producer = tokio::spawn(async move {
        record_task(&buffer, &started("call_a")).unwrap();
        record_task(&buffer, &running("call_a", 1)).unwrap();
        panic!("the run crashed");
    });
    if producer.await.is_err() {
        panicked.store(true, Ordering::SeqCst);
    }
    assert!(panicked.load(Ordering::SeqCst));
    settle().await;
    assert_eq!(
        h.store.run_events().await.len(),
        2,
        "dropping the last handle flushes"
    );
}
