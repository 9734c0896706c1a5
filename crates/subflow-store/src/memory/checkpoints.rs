//! [`CheckpointStore`] for [`MemoryStore`].

use async_trait::async_trait;

use crate::checkpoints::{Checkpoint, CheckpointStore, NewCheckpoint};
use crate::{MemoryStore, Result};

#[async_trait]
impl CheckpointStore for MemoryStore {
    async fn put_checkpoint(&self, checkpoint: NewCheckpoint) -> Result<Checkpoint> {
        let fence = checkpoint.fence()?;
        let stored = checkpoint.into_stored()?;
        let mut inner = self.lock();
        if let Some((run_id, owner)) = fence {
            self.streams.check_lease(&run_id, Some(&owner))?;
        }
        inner.checkpoints.push(stored.clone());
        Ok(stored)
    }

    async fn latest_checkpoint(&self, thread_id: &str) -> Result<Option<Checkpoint>> {
        Ok(self
            .lock()
            .checkpoints
            .iter()
            .rev()
            .find(|c| c.thread_id == thread_id)
            .cloned())
    }

    async fn get_checkpoint(
        &self,
        thread_id: &str,
        checkpoint_id: &str,
    ) -> Result<Option<Checkpoint>> {
        Ok(self
            .lock()
            .checkpoints
            .iter()
            .find(|c| c.thread_id == thread_id && c.checkpoint_id == checkpoint_id)
            .cloned())
    }

    async fn list_checkpoints(
        &self,
        thread_id: &str,
        limit: u32,
        before: Option<&str>,
    ) -> Result<Vec<Checkpoint>> {
        let inner = self.lock();
        let newest_first = inner
            .checkpoints
            .iter()
            .rev()
            .filter(|c| c.thread_id == thread_id);
        let older = newest_first
            .skip_while(|c| before.is_some_and(|id| c.checkpoint_id != id))
            .skip(usize::from(before.is_some()));
        Ok(older.take(limit as usize).cloned().collect())
    }

    async fn delete_run_checkpoints(&self, thread_id: &str, run_id: &str) -> Result<u64> {
        let mut inner = self.lock();
        let before = inner.checkpoints.len();
        inner
            .checkpoints
            .retain(|c| !(c.thread_id == thread_id && c.run_id.as_deref() == Some(run_id)));
        Ok((before - inner.checkpoints.len()) as u64)
    }
}
