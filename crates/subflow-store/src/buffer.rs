//! The per-run event buffer (docs/events.md#buffering-and-durability) and the process-wide retry queue behind it.
//!
//! A run's producers hand records to an [`EventBuffer`] without waiting: the buffer's
//! task batches them and writes each batch with one [`EventStore::append`]. A failed
//! write is kept ahead of newer records and never raised into the run. Records still
//! unwritten after the final flush go to the [`RetryQueue`], which keeps retrying with
//! backoff and, after [`RetryPolicy::spill_after`] or at shutdown, appends them to the
//! spill file that the next start re-applies. Every record carries a UUID v7
//! `event_id` from the moment it is emitted, so a batch retried after an ambiguous
//! failure never duplicates rows.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Map, Value};
use subflow_contracts::task_events::MappedTaskEvent;
use subflow_contracts::{EventType, NewEvent};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};

use crate::spill::SpillFile;
use crate::{EventStore, Result, validate_batch};

/// Most records taken from the channel before the flush trigger is checked, which
/// bounds one write transaction.
const MAX_DRAIN: usize = 1000;

/// Which buffer a record went through, the `buffer` label of the store metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferKind {
    /// Subagent lifecycle and step records.
    Subagent,
    /// The run journal's own records.
    Journal,
}

impl BufferKind {
    /// The metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            BufferKind::Subagent => "subagent",
            BufferKind::Journal => "journal",
        }
    }

    const fn index(self) -> usize {
        match self {
            BufferKind::Subagent => 0,
            BufferKind::Journal => 1,
        }
    }
}

/// When a buffer flushes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferPolicy {
    /// The metric label and the flush-on-end rule (subagent buffers flush on `subagent.end`).
    pub kind: BufferKind,
    /// Flush when this many records are pending.
    pub threshold: usize,
    /// Flush when the oldest pending record is this old.
    pub flush_interval: Duration,
    /// Waits before the retries of the final flush.
    pub final_retry_delays: Vec<Duration>,
}

impl BufferPolicy {
    /// The subagent buffer: 25 records, `subagent.end`, or `flush_interval`.
    pub fn subagent(flush_interval: Duration) -> Self {
        BufferPolicy {
            kind: BufferKind::Subagent,
            threshold: 25,
            flush_interval,
            final_retry_delays: vec![Duration::from_secs(1), Duration::from_secs(2)],
        }
    }

    /// The journal buffer: 20 records or `flush_interval`.
    pub fn journal(flush_interval: Duration) -> Self {
        BufferPolicy {
            kind: BufferKind::Journal,
            threshold: 20,
            ..Self::subagent(flush_interval)
        }
    }

    fn flushes_on(&self, event: &NewEvent) -> bool {
        self.kind == BufferKind::Subagent && event.event_type == EventType::SubagentEnd.as_str()
    }
}

/// Process-wide counters behind the `subflow_event_store_*` metrics.
#[derive(Debug, Default)]
pub struct StoreCounters {
    flushes: [AtomicU64; 2],
    flush_failures: [AtomicU64; 2],
    pending: [AtomicI64; 2],
    spilled: [AtomicU64; 2],
}

impl StoreCounters {
    /// Successful batch writes.
    pub fn flushes(&self, kind: BufferKind) -> u64 {
        self.flushes[kind.index()].load(Ordering::Relaxed)
    }

    /// `subflow_event_store_flush_failures_total{buffer}`.
    pub fn flush_failures(&self, kind: BufferKind) -> u64 {
        self.flush_failures[kind.index()].load(Ordering::Relaxed)
    }

    /// `subflow_event_store_pending_events{buffer}`: records emitted and not yet written.
    pub fn pending(&self, kind: BufferKind) -> i64 {
        self.pending[kind.index()].load(Ordering::Relaxed)
    }

    /// `subflow_event_store_spilled_events_total{buffer}`.
    pub fn spilled(&self, kind: BufferKind) -> u64 {
        self.spilled[kind.index()].load(Ordering::Relaxed)
    }

    fn add_pending(&self, kind: BufferKind, delta: i64) {
        self.pending[kind.index()].fetch_add(delta, Ordering::Relaxed);
    }
}

/// The run a buffer records for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventScope {
    /// Thread id.
    pub thread_id: String,
    /// Run id.
    pub run_id: String,
    /// Run owner.
    pub user_id: Option<String>,
}

// Records travel unboxed: `Close` is sent once per run, so boxing every record to
// shrink the rare variant would cost an allocation per event for nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    Add(NewEvent),
    Flush(oneshot::Sender<bool>),
    Lend(oneshot::Sender<Lending>),
    Close(oneshot::Sender<bool>),
}

/// A buffer's answer to a loan request.
enum Lending {
    /// A copy of its pending records, and where to say whether they were stored. The
    /// buffer keeps them, and stores nothing, until that answer comes.
    Lent(Vec<NewEvent>, oneshot::Sender<bool>),
    /// Nothing was pending; `false` when the records were not all stored (a closing
    /// buffer whose final flush failed and handed them to the retry queue).
    Flushed(bool),
}

/// The records one or more buffers lent for a write of their own: the borrower stores
/// them (in a transaction that may hold more) and settles the loan. A loan dropped
/// unsettled leaves the records with their buffers, unstored, ahead of later records.
#[derive(Debug, Default)]
pub struct Loan {
    records: Vec<NewEvent>,
    /// Where each lending buffer is told whether its records were stored.
    lenders: Vec<oneshot::Sender<bool>>,
    /// A buffer that lent nothing said its records are not all stored.
    unsettled: bool,
}

impl Loan {
    /// The lent records, in each buffer's order, buffers in the order they lent.
    pub fn records(&self) -> &[NewEvent] {
        &self.records
    }

    /// False when a buffer without records to lend had failed to store its own (they
    /// are with the retry queue): the records the borrower meant to follow are not
    /// stored.
    pub fn complete(&self) -> bool {
        !self.unsettled
    }

    /// Says whether the records were stored; unstored ones stay with their buffers.
    pub fn settle(mut self, stored: bool) {
        self.tell(stored);
    }

    fn tell(&mut self, stored: bool) {
        for lender in self.lenders.drain(..) {
            // A buffer task that is gone holds nothing more.
            let _ = lender.send(stored);
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        self.tell(false);
    }
}

/// A cheap-to-clone handle onto one run's buffer.
#[derive(Debug, Clone)]
pub struct EventBuffer {
    scope: Arc<EventScope>,
    kind: BufferKind,
    tx: mpsc::UnboundedSender<Command>,
    retry: RetryQueue,
    counters: Arc<StoreCounters>,
    /// Records recorded here and not yet stored, so a flush with nothing to store
    /// answers at once.
    unstored: Arc<AtomicUsize>,
}

impl EventBuffer {
    /// Starts the buffer task of one run.
    pub fn spawn(
        store: Arc<dyn EventStore>,
        scope: EventScope,
        policy: BufferPolicy,
        retry: RetryQueue,
        counters: Arc<StoreCounters>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let kind = policy.kind;
        let unstored = Arc::new(AtomicUsize::new(0));
        let worker = BufferTask {
            store,
            policy,
            pending: Vec::new(),
            deadline: None,
            retry: retry.clone(),
            counters: counters.clone(),
            unstored: unstored.clone(),
        };
        let _detached: JoinHandle<()> = tokio::spawn(worker.run(rx));
        EventBuffer {
            scope: Arc::new(scope),
            kind,
            tx,
            retry,
            counters,
            unstored,
        }
    }

    /// The run this buffer records for.
    pub fn scope(&self) -> &EventScope {
        &self.scope
    }

    /// Records one event of this run. Never waits on storage. An event that could
    /// never be stored (bad type, category or thread) is refused here, whole.
    pub fn record(
        &self,
        event_type: &str,
        category: &str,
        content: Value,
        metadata: Map<String, Value>,
    ) -> Result<()> {
        let event = NewEvent::new(
            self.scope.thread_id.as_str(),
            self.scope.run_id.as_str(),
            event_type,
            category,
            content,
            metadata,
        )
        .with_user(self.scope.user_id.clone());
        self.record_event(event)
    }

    /// Records a live task event mapped to its `subagent.*` record.
    pub fn record_mapped(&self, mapped: MappedTaskEvent) -> Result<()> {
        let event = mapped.into_event(&self.scope.thread_id, &self.scope.run_id);
        self.record_event(event.with_user(self.scope.user_id.clone()))
    }

    /// Records an event built elsewhere (e.g. one whose direct write failed, keeping its
    /// `event_id` so an ambiguous failure never duplicates it). Never waits on storage.
    pub fn record_event(&self, event: NewEvent) -> Result<()> {
        validate_batch(std::slice::from_ref(&event))?;
        self.counters.add_pending(self.kind, 1);
        self.unstored.fetch_add(1, Ordering::SeqCst);
        if let Err(mpsc::error::SendError(Command::Add(event))) = self.tx.send(Command::Add(event))
        {
            // The buffer already closed: the record goes straight to the retry queue.
            self.unstored.fetch_sub(1, Ordering::SeqCst);
            self.retry.push(self.kind, vec![event]);
        }
        Ok(())
    }

    /// Writes every record recorded before this call now, in one batch, and says whether
    /// they are stored. On failure they stay pending, ahead of later records. A buffer
    /// that already closed holds nothing: its final flush ran, and what it could not
    /// write went to the retry queue.
    pub async fn flush(&self) -> bool {
        if self.unstored.load(Ordering::SeqCst) == 0 {
            return true;
        }
        let (done_tx, done_rx) = oneshot::channel();
        if self.tx.send(Command::Flush(done_tx)).is_err() {
            return true;
        }
        done_rx.await.unwrap_or(true)
    }

    /// Lends the records recorded before this call to `loan`: the buffer stores nothing
    /// until the loan is settled, so whatever the borrower writes after them follows
    /// them. Lends nothing when nothing is pending; a closed buffer lends nothing.
    pub async fn lend_to(&self, loan: &mut Loan) {
        if self.unstored.load(Ordering::SeqCst) == 0 {
            return;
        }
        let (reply, answer) = oneshot::channel();
        if self.tx.send(Command::Lend(reply)).is_err() {
            return;
        }
        match answer.await {
            Ok(Lending::Lent(records, settle)) => {
                loan.lenders.push(settle);
                loan.records.extend(records);
            }
            Ok(Lending::Flushed(stored)) => loan.unsettled |= !stored,
            Err(_) => {}
        }
    }

    /// Runs the final flush (with its retries) and stops the buffer. Records that are
    /// still unwritten afterwards are handed to the retry queue. Says whether the final
    /// flush stored everything; idempotent (a buffer already closed says true).
    pub async fn close(&self) -> bool {
        let (done_tx, done_rx) = oneshot::channel();
        if self.tx.send(Command::Close(done_tx)).is_err() {
            // The task already finished its final flush.
            return true;
        }
        done_rx.await.unwrap_or(true)
    }
}

struct BufferTask {
    store: Arc<dyn EventStore>,
    policy: BufferPolicy,
    pending: Vec<NewEvent>,
    /// When the time trigger fires next; set while records are pending.
    deadline: Option<Instant>,
    retry: RetryQueue,
    counters: Arc<StoreCounters>,
    unstored: Arc<AtomicUsize>,
}

impl BufferTask {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        loop {
            let mut next = match self.deadline {
                Some(deadline) => tokio::select! {
                    command = rx.recv() => command,
                    () = sleep_until(deadline) => {
                        self.flush().await;
                        continue;
                    }
                },
                None => rx.recv().await,
            };
            // Records already sent are pending too: take every one that is waiting, so a
            // flush writes all of them in one batch. Under load that is one commit for
            // many records instead of one per 25.
            let mut flush_now = false;
            let mut waiting = Vec::new();
            let mut lending = None;
            let mut taken = 0;
            let closing = loop {
                match next {
                    Some(Command::Add(event)) => {
                        flush_now |= self.policy.flushes_on(&event);
                        self.push(event);
                    }
                    Some(Command::Flush(done)) => {
                        flush_now = true;
                        waiting.push(done);
                    }
                    Some(Command::Lend(reply)) => {
                        lending = Some(reply);
                        break None;
                    }
                    Some(Command::Close(done)) => break Some(Some(done)),
                    None => break Some(None),
                }
                taken += 1;
                if taken >= MAX_DRAIN {
                    break None;
                }
                match rx.try_recv() {
                    Ok(command) => next = Some(command),
                    Err(_) => break None,
                }
            };
            if let Some(done) = closing {
                rx.close();
                let mut lenders = Vec::new();
                while let Ok(command) = rx.try_recv() {
                    match command {
                        Command::Add(event) => self.push(event),
                        Command::Flush(done) => waiting.push(done),
                        Command::Lend(reply) => lenders.push(reply),
                        Command::Close(_) => {}
                    }
                }
                let stored = self.final_flush().await;
                for done in waiting.into_iter().chain(done) {
                    let _ = done.send(stored);
                }
                for reply in lenders {
                    let _ = reply.send(Lending::Flushed(stored));
                }
                return;
            }
            if let Some(reply) = lending {
                let stored = self.lend(reply).await;
                for done in waiting {
                    let _ = done.send(stored);
                }
            } else if flush_now || self.pending.len() >= self.policy.threshold {
                let stored = self.flush().await;
                for done in waiting {
                    let _ = done.send(stored);
                }
            }
        }
    }

    fn push(&mut self, event: NewEvent) {
        if self.pending.is_empty() {
            self.deadline = Some(Instant::now() + self.policy.flush_interval);
        }
        self.pending.push(event);
    }

    /// Writes every pending record in one batch. On failure the records stay pending,
    /// ahead of anything added later, and the time trigger is re-armed.
    async fn flush(&mut self) -> bool {
        if self.pending.is_empty() {
            self.deadline = None;
            return true;
        }
        let kind = self.policy.kind;
        match self.store.append(&self.pending).await {
            Ok(_) => {
                self.counters.flushes[kind.index()].fetch_add(1, Ordering::Relaxed);
                self.counters
                    .add_pending(kind, -(self.pending.len() as i64));
                self.unstored
                    .fetch_sub(self.pending.len(), Ordering::SeqCst);
                self.pending.clear();
                self.deadline = None;
                true
            }
            Err(error) => {
                self.counters.flush_failures[kind.index()].fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    buffer = kind.as_str(),
                    pending = self.pending.len(),
                    error = %error,
                    "run event flush failed; records kept for retry"
                );
                self.deadline = Some(Instant::now() + self.policy.flush_interval);
                false
            }
        }
    }

    /// Lends a copy of every pending record through `reply` and waits until the
    /// borrower settles the loan: stored, they are done; else (or when the loan is gone)
    /// they stay pending, ahead of anything recorded since. Says whether they were stored.
    async fn lend(&mut self, reply: oneshot::Sender<Lending>) -> bool {
        if self.pending.is_empty() {
            let _ = reply.send(Lending::Flushed(true));
            return true;
        }
        let (settle, settled) = oneshot::channel();
        if reply
            .send(Lending::Lent(self.pending.clone(), settle))
            .is_err()
        {
            return false;
        }
        if !settled.await.unwrap_or(false) {
            self.deadline = Some(Instant::now() + self.policy.flush_interval);
            return false;
        }
        // Nothing was recorded meanwhile: this task waited, and records wait in the
        // channel.
        let kind = self.policy.kind;
        let count = self.pending.len();
        self.counters.flushes[kind.index()].fetch_add(1, Ordering::Relaxed);
        self.counters.add_pending(kind, -(count as i64));
        self.unstored.fetch_sub(count, Ordering::SeqCst);
        self.pending.clear();
        self.deadline = None;
        true
    }

    /// The last flush, retried; what it cannot write goes to the retry queue. Says
    /// whether everything was stored.
    async fn final_flush(&mut self) -> bool {
        if self.flush().await {
            return true;
        }
        for delay in self.policy.final_retry_delays.clone() {
            sleep(delay).await;
            if self.flush().await {
                return true;
            }
        }
        let kind = self.policy.kind;
        let records = std::mem::take(&mut self.pending);
        self.counters.add_pending(kind, -(records.len() as i64));
        self.unstored.fetch_sub(records.len(), Ordering::SeqCst);
        self.retry.push(kind, records);
        false
    }
}

/// How the retry queue retries and when it gives up to the spill file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// First wait after a failure.
    pub initial_backoff: Duration,
    /// Longest wait between attempts.
    pub max_backoff: Duration,
    /// Records unwritten for this long are spilled.
    pub spill_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            spill_after: Duration::from_secs(300),
        }
    }
}

enum RetryCommand {
    Push(BufferKind, Vec<NewEvent>),
    Shutdown(oneshot::Sender<()>),
}

/// A handle onto the process-wide queue of records that outlived their buffer.
#[derive(Debug, Clone)]
pub struct RetryQueue {
    tx: mpsc::UnboundedSender<RetryCommand>,
    spill: Arc<SpillFile>,
    counters: Arc<StoreCounters>,
}

impl RetryQueue {
    /// Starts the retry queue task.
    pub fn spawn(
        store: Arc<dyn EventStore>,
        spill: Arc<SpillFile>,
        policy: RetryPolicy,
        counters: Arc<StoreCounters>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = RetryTask {
            store,
            policy,
            queue: VecDeque::new(),
            spill: spill.clone(),
            counters: counters.clone(),
        };
        let _detached: JoinHandle<()> = tokio::spawn(worker.run(rx));
        RetryQueue {
            tx,
            spill,
            counters,
        }
    }

    /// Takes records that a buffer could not write.
    pub fn push(&self, kind: BufferKind, records: Vec<NewEvent>) {
        if records.is_empty() {
            return;
        }
        self.counters.add_pending(kind, records.len() as i64);
        if let Err(mpsc::error::SendError(RetryCommand::Push(kind, records))) =
            self.tx.send(RetryCommand::Push(kind, records))
        {
            // The queue has shut down: spill at once rather than drop.
            spill_records(&self.spill, &self.counters, kind, &records);
        }
    }

    /// Spills everything still queued and stops the queue. Call after every buffer closed.
    pub async fn shutdown(&self) {
        let (done_tx, done_rx) = oneshot::channel();
        if self.tx.send(RetryCommand::Shutdown(done_tx)).is_ok() {
            let _ = done_rx.await;
        }
    }
}

struct RetryEntry {
    kind: BufferKind,
    records: Vec<NewEvent>,
    since: Instant,
}

struct RetryTask {
    store: Arc<dyn EventStore>,
    policy: RetryPolicy,
    queue: VecDeque<RetryEntry>,
    spill: Arc<SpillFile>,
    counters: Arc<StoreCounters>,
}

impl RetryTask {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<RetryCommand>) {
        let mut backoff = self.policy.initial_backoff;
        loop {
            let command = if self.queue.is_empty() {
                rx.recv().await
            } else {
                tokio::select! {
                    command = rx.recv() => command,
                    () = sleep(backoff) => {
                        backoff = if self.retry_front().await {
                            self.policy.initial_backoff
                        } else {
                            (backoff * 2).min(self.policy.max_backoff)
                        };
                        continue;
                    }
                }
            };
            match command {
                Some(RetryCommand::Push(kind, records)) => self.queue.push_back(RetryEntry {
                    kind,
                    records,
                    since: Instant::now(),
                }),
                Some(RetryCommand::Shutdown(done)) => {
                    rx.close();
                    while let Ok(RetryCommand::Push(kind, records)) = rx.try_recv() {
                        self.queue.push_back(RetryEntry {
                            kind,
                            records,
                            since: Instant::now(),
                        });
                    }
                    self.spill_all();
                    let _ = done.send(());
                    return;
                }
                None => {
                    self.spill_all();
                    return;
                }
            }
        }
    }

    /// Retries the oldest entry; spills it once it has waited too long.
    async fn retry_front(&mut self) -> bool {
        let Some(entry) = self.queue.front() else {
            return true;
        };
        match self.store.append(&entry.records).await {
            Ok(_) => {
                let entry = self.queue.pop_front().expect("front exists");
                self.counters
                    .add_pending(entry.kind, -(entry.records.len() as i64));
                true
            }
            Err(error) => {
                tracing::warn!(records = entry.records.len(), %error, "run event retry failed");
                if entry.since.elapsed() >= self.policy.spill_after {
                    let entry = self.queue.pop_front().expect("front exists");
                    spill_records(&self.spill, &self.counters, entry.kind, &entry.records);
                }
                false
            }
        }
    }

    fn spill_all(&mut self) {
        for entry in self.queue.drain(..) {
            spill_records(&self.spill, &self.counters, entry.kind, &entry.records);
        }
    }
}

fn spill_records(
    spill: &SpillFile,
    counters: &StoreCounters,
    kind: BufferKind,
    records: &[NewEvent],
) {
    counters.add_pending(kind, -(records.len() as i64));
    match spill.append(records) {
        Ok(()) => {
            counters.spilled[kind.index()].fetch_add(records.len() as u64, Ordering::Relaxed);
            tracing::warn!(
                records = records.len(),
                path = %spill.path().display(),
                "run events spilled to disk; they are re-applied at the next start"
            );
        }
        Err(error) => tracing::error!(
            records = records.len(),
            path = %spill.path().display(),
            %error,
            "run events could not be spilled and are lost"
        ),
    }
}
