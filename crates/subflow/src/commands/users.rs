//! `subflow users add|list|disable` (docs/api.md#auth-and-ownership): direct administration of the users
//! that tokens belong to. Threads record their owner's user id.

use serde_json::{Value, json};
use subflow_store::User;

use super::UsageError;
use super::admin::{AdminArgs, store_error, table};

/// `subflow users …`.
#[derive(Debug, clap::Subcommand)]
pub enum UsersCommand {
    /// Add a user; prints its id.
    Add {
        /// 1-64 characters from A-Z, a-z, 0-9, '.', '_', '@' and '-'.
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// List every user.
    List {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Disable a user: none of its tokens authenticates any more.
    Disable {
        /// The user's name or id.
        #[arg(value_name = "NAME_OR_ID")]
        user: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// A user as `--json` prints it.
pub fn user_json(user: &User) -> Value {
    json!({"id": user.id, "name": user.name, "disabled": user.disabled, "created_at": user.created_at})
}

fn status(user: &User) -> &'static str {
    if user.disabled { "disabled" } else { "active" }
}

/// The user named or identified by `id_or_name`, else a usage error that says how to
/// find one.
pub async fn find_user(store: &dyn subflow_store::Store, id_or_name: &str) -> anyhow::Result<User> {
    store
        .find_user(id_or_name)
        .await
        .map_err(store_error)?
        .ok_or_else(|| {
            UsageError(format!(
                "no user is named or has the id '{id_or_name}'; `subflow users list` shows them \
                 and `subflow users add NAME` adds one"
            ))
            .into()
        })
}

/// Runs `subflow users …`.
pub async fn run(command: UsersCommand) -> anyhow::Result<()> {
    let admin = match &command {
        UsersCommand::Add { admin, .. }
        | UsersCommand::List { admin }
        | UsersCommand::Disable { admin, .. } => admin.clone(),
    };
    let database = admin.open().await?;
    let result = execute(command, &admin, &*database.store).await;
    database.close().await;
    result
}

async fn execute(
    command: UsersCommand,
    admin: &AdminArgs,
    store: &dyn subflow_store::Store,
) -> anyhow::Result<()> {
    match command {
        UsersCommand::Add { name, .. } => {
            let user = store.add_user(&name).await.map_err(store_error)?;
            if admin.json {
                outln!("{}", user_json(&user))?;
            } else {
                outln!("{}", user.id)?;
            }
            eprintln!(
                "subflow: added user {}; `subflow tokens create --user {} --perm …` gives it a token",
                user.name, user.name
            );
        }
        UsersCommand::List { .. } => {
            let users = store.list_users().await.map_err(store_error)?;
            if admin.json {
                outln!("{}", Value::from_iter(users.iter().map(user_json)))?;
            } else {
                let mut rows = vec![vec![
                    "ID".to_owned(),
                    "NAME".to_owned(),
                    "STATUS".to_owned(),
                    "CREATED_AT".to_owned(),
                ]];
                rows.extend(users.iter().map(|user| {
                    vec![
                        user.id.clone(),
                        user.name.clone(),
                        status(user).to_owned(),
                        user.created_at.clone(),
                    ]
                }));
                out!("{}", table(&rows))?;
            }
        }
        UsersCommand::Disable { user, .. } => {
            let found = find_user(store, &user).await?;
            store.disable_user(&found.id).await.map_err(store_error)?;
            let disabled = User {
                disabled: true,
                ..found
            };
            if admin.json {
                outln!("{}", user_json(&disabled))?;
            }
            eprintln!(
                "subflow: disabled user {} ({}); its tokens no longer authenticate",
                disabled.name, disabled.id
            );
        }
    }
    Ok(())
}
