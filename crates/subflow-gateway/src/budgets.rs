//! Money budgets as the gateway sees them (docs/usage-and-cost.md#budgets): what a
//! thread, a user's day and a user's earlier batches have spent, read from the store and
//! priced by the one price function. The runtime reads them through [`StoreSpend`] when a
//! run starts and when a batch is submitted; `/token-usage`, `/api/usage` and the batch
//! routes show them beside the limits.

use std::sync::Arc;

use async_trait::async_trait;
use subflow_contracts::api::usage::BudgetSpend;
use subflow_contracts::cost::round6;
use subflow_runtime::budget::{BudgetScope, Budgets, BudgetsConfig, SpendHistory};
use subflow_store::batches::{ActivityQuery, BatchActivity, BatchQuery, BatchRecord, BatchScope};
use subflow_store::{RunRecord, RunScope, Store};
use time::{OffsetDateTime, Time};

use crate::usage::{ModelFacts, run_costs};

/// Runs read per page while summing.
const PAGE: u32 = 5_000;

/// Batches read per page while summing.
const BATCH_PAGE: u32 = 100;

/// The budgets a runtime holds runs and batch items to, reading earlier spend from
/// `store`.
pub fn budgets(config: BudgetsConfig, store: Arc<dyn Store>, models: &[ModelFacts]) -> Budgets {
    let models: Arc<[ModelFacts]> = models.into();
    Budgets {
        config,
        history: Arc::new(StoreSpend {
            store,
            models: models.clone(),
        }),
        models,
    }
}

/// Earlier spend, read from the store.
#[derive(Debug)]
pub struct StoreSpend {
    store: Arc<dyn Store>,
    models: Arc<[ModelFacts]>,
}

#[async_trait]
impl SpendHistory for StoreSpend {
    async fn spent_before(
        &self,
        user_id: &str,
        thread_id: &str,
        run_id: &str,
    ) -> Result<(f64, f64), String> {
        let store = &*self.store;
        let thread = thread_spent(store, &self.models, user_id, thread_id, Some(run_id))
            .await
            .map_err(|error| error.to_string())?;
        let day = day_spent(store, &self.models, user_id, Some(run_id))
            .await
            .map_err(|error| error.to_string())?;
        Ok((thread, day))
    }

    async fn item_cost(&self, user_id: &str, subagent_type: &str) -> Result<Option<f64>, String> {
        let batches = batches_of(&*self.store, &BatchScope::user(user_id))
            .await
            .map_err(|error| error.to_string())?;
        let (mut spent, mut items) = (0.0, 0);
        for (_, activity) in batches
            .iter()
            .filter(|(batch, _)| batch.subagent_type == subagent_type)
        {
            spent += activity.spent(&self.models);
            items += activity
                .by_model
                .iter()
                .map(|group| group.items)
                .sum::<u64>();
        }
        Ok((items > 0).then(|| spent / items as f64))
    }
}

/// What `runs` cost, every run counted whatever its status.
pub fn runs_spent<'a>(runs: impl IntoIterator<Item = &'a RunRecord>, models: &[ModelFacts]) -> f64 {
    runs.into_iter()
        .flat_map(|run| run_costs(&run.usage, run.model_name.as_deref(), models))
        .map(|(_, _, cost)| cost)
        .sum()
}

/// What `thread_id`'s runs (but `except`) and `user_id`'s batches in it have spent.
pub async fn thread_spent(
    store: &dyn Store,
    models: &[ModelFacts],
    user_id: &str,
    thread_id: &str,
    except: Option<&str>,
) -> subflow_store::Result<f64> {
    let mut spent = 0.0;
    let mut offset = 0;
    loop {
        let page = store
            .list_runs(RunScope::Thread(thread_id), None, PAGE, offset)
            .await?;
        let full = page.len() == PAGE as usize;
        offset += PAGE;
        spent += runs_spent(
            page.iter()
                .filter(|run| Some(run.run_id.as_str()) != except),
            models,
        );
        if !full {
            break;
        }
    }
    let batches = batches_of(store, &BatchScope::thread(user_id, thread_id)).await?;
    Ok(spent
        + batches
            .iter()
            .map(|(_, activity)| activity.spent(models))
            .sum::<f64>())
}

/// The start of today, UTC, in the stored RFC 3339 form.
fn today() -> String {
    let now = OffsetDateTime::now_utc();
    subflow_store::rfc3339(now.replace_time(Time::MIDNIGHT))
}

/// What `user_id`'s runs (but `except`) and batches created today (UTC) have spent.
pub async fn day_spent(
    store: &dyn Store,
    models: &[ModelFacts],
    user_id: &str,
    except: Option<&str>,
) -> subflow_store::Result<f64> {
    let from = today();
    let to = subflow_store::rfc3339(OffsetDateTime::now_utc() + time::Duration::days(1));
    let runs = runs_of(store, user_id, &from, &to).await?;
    let batches = batches_of(store, &BatchScope::user(user_id)).await?;
    Ok(runs_spent(
        runs.iter()
            .filter(|run| Some(run.run_id.as_str()) != except),
        models,
    ) + batches
        .iter()
        .filter(|(batch, _)| batch.created_at >= from)
        .map(|(_, activity)| activity.spent(models))
        .sum::<f64>())
}

/// `user`'s runs created in `[from, to)`: pages of their runs, newest first, until one
/// older than `from`.
pub async fn runs_of(
    store: &dyn Store,
    user: &str,
    from: &str,
    to: &str,
) -> subflow_store::Result<Vec<RunRecord>> {
    let mut runs = Vec::new();
    let mut offset = 0;
    loop {
        let page = store
            .list_runs(RunScope::Owner(user), None, PAGE, offset)
            .await?;
        let full = page.len() == PAGE as usize;
        offset += PAGE;
        let older = page
            .last()
            .is_some_and(|run| run.created_at.as_str() < from);
        runs.extend(
            page.into_iter()
                .filter(|run| from <= run.created_at.as_str() && run.created_at.as_str() < to),
        );
        if !full || older {
            return Ok(runs);
        }
    }
}

/// Every batch in `scope` with its activity.
pub async fn batches_of(
    store: &dyn Store,
    scope: &BatchScope,
) -> subflow_store::Result<Vec<(BatchRecord, BatchActivity)>> {
    let mut batches = Vec::new();
    loop {
        let query = BatchQuery {
            status: None,
            limit: BATCH_PAGE,
            offset: u32::try_from(batches.len()).unwrap_or(u32::MAX),
        };
        let page = store.list_batches(scope, &query).await?;
        let full = page.len() == BATCH_PAGE as usize;
        batches.extend(page);
        if !full {
            break;
        }
    }
    if batches.is_empty() {
        return Ok(Vec::new());
    }
    let activity = store
        .batch_activity(
            scope,
            &ActivityQuery {
                batch_ids: None,
                completed_since: subflow_store::now_rfc3339(),
            },
        )
        .await?;
    Ok(batches
        .into_iter()
        .map(|batch| {
            let found = BatchActivity::find(&activity, &batch.id);
            (batch, found)
        })
        .collect())
}

/// One limit and its spend, as the API shows it.
pub fn shown(budgets: &Budgets, scope: BudgetScope, spent: f64) -> Option<BudgetSpend> {
    let limit = budgets.config.limit(scope)?;
    Some(BudgetSpend {
        scope: scope.as_str().to_owned(),
        limit,
        spent: round6(spent),
        currency: budgets.currency(),
    })
}

/// The user's day's budget with its spend, for `/token-usage` and `/api/usage`; `None`
/// without one.
pub async fn day_budget(
    budgets: Option<&Budgets>,
    store: &dyn Store,
    user_id: &str,
) -> subflow_store::Result<Option<BudgetSpend>> {
    let Some(budgets) = budgets.filter(|b| b.config.limit(BudgetScope::UserDaily).is_some()) else {
        return Ok(None);
    };
    let spent = day_spent(store, &budgets.models, user_id, None).await?;
    Ok(shown(budgets, BudgetScope::UserDaily, spent))
}
