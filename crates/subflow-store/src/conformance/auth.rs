//! Conformance cases of [`AuthStore`](crate::AuthStore): users and tokens (docs/api.md#auth-and-ownership).
//!
//! [`conformance_tests!`](crate::conformance_tests) expands these through
//! [`auth_conformance_tests!`](crate::auth_conformance_tests), so every backend runs them.

use std::sync::Arc;
use std::time::Duration;

use subflow_contracts::auth::token_digest;
use subflow_contracts::{Permission, Permissions};
use time::OffsetDateTime;

use crate::auth::Refusal;
use crate::{Error, NewToken, Store, TokenRecord, rfc3339};

/// Expands to one `#[tokio::test]` per auth case; invoked by `conformance_tests!`.
#[doc(hidden)]
#[macro_export]
macro_rules! auth_conformance_tests {
    ($factory:expr) => {
        $crate::auth_conformance_tests!(@cases $factory;
            auth_users_are_added_listed_found_and_disabled,
            auth_invalid_users_are_typed_errors_and_write_nothing,
            auth_tokens_are_found_by_digest_with_their_user,
            auth_invalid_tokens_are_typed_errors_and_write_nothing,
            auth_tokens_list_in_creation_order_per_user,
            auth_revoking_keeps_the_first_revocation,
            auth_expired_tokens_are_refused,
            auth_disabling_a_user_refuses_its_tokens,
            auth_touching_records_the_last_use,
        );
    };
    (@cases $factory:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = $factory.await;
                $crate::conformance::auth::$case(fixture.store.clone()).await;
            }
        )+
    };
}

fn permissions(list: &str) -> Permissions {
    Permissions::parse_list(list).expect("a valid permission list")
}

/// A token for `user_id` whose text is `sf_` + `seed` repeated.
fn new_token(user_id: &str, seed: char, list: &str) -> NewToken {
    NewToken {
        user_id: user_id.to_owned(),
        name: Some(format!("token {seed}")),
        permissions: permissions(list),
        expires_at: None,
        digest: token_digest(&format!("sf_{}", seed.to_string().repeat(43))),
    }
}

fn ids(tokens: &[TokenRecord]) -> Vec<&str> {
    tokens.iter().map(|t| t.id.as_str()).collect()
}

/// Adding, listing, finding by id or name, and disabling users.
pub async fn auth_users_are_added_listed_found_and_disabled(store: Arc<dyn Store>) {
    assert!(store.list_users().await.unwrap().is_empty());
    let ana = store.add_user("ana").await.unwrap();
    let bo = store.add_user("bo@example.com").await.unwrap();
    assert_eq!(ana.name, "ana");
    assert!(!ana.disabled);
    assert_ne!(ana.id, bo.id);
    assert!(!ana.id.is_empty() && !ana.created_at.is_empty());
    assert_eq!(store.list_users().await.unwrap(), [ana.clone(), bo.clone()]);

    assert_eq!(store.find_user(&ana.id).await.unwrap(), Some(ana.clone()));
    assert_eq!(
        store.find_user("bo@example.com").await.unwrap(),
        Some(bo.clone())
    );
    assert_eq!(store.find_user("nobody").await.unwrap(), None);

    assert!(store.disable_user(&bo.id).await.unwrap());
    assert!(store.disable_user(&bo.id).await.unwrap(), "idempotent");
    assert!(!store.disable_user("no-such-id").await.unwrap());
    assert!(
        !store.disable_user("ana").await.unwrap(),
        "disable takes an id, not a name"
    );
    let users = store.list_users().await.unwrap();
    assert_eq!(users.len(), 2);
    assert!(!users[0].disabled);
    assert!(users[1].disabled);
    assert_eq!(users[1].created_at, bo.created_at);
}

/// A taken or malformed name is a typed error and adds nobody.
pub async fn auth_invalid_users_are_typed_errors_and_write_nothing(store: Arc<dyn Store>) {
    store.add_user("ana").await.unwrap();
    assert!(matches!(
        store.add_user("ana").await,
        Err(Error::UserExists(name)) if name == "ana"
    ));
    for bad in ["", "two words", &"x".repeat(65)] {
        let error = store.add_user(bad).await.unwrap_err();
        assert!(matches!(error, Error::InvalidUserName(_)), "{bad}: {error}");
        assert!(error.is_invalid_input());
    }
    assert_eq!(store.list_users().await.unwrap().len(), 1);
}

/// A token is stored under its digest and found with its user; nothing else finds it.
pub async fn auth_tokens_are_found_by_digest_with_their_user(store: Arc<dyn Store>) {
    let ana = store.add_user("ana").await.unwrap();
    let expires = OffsetDateTime::now_utc() + Duration::from_secs(3600);
    let token = NewToken {
        expires_at: Some(expires),
        ..new_token(&ana.id, 'a', "runs:write,runs:read")
    };
    let digest = token.digest.clone();
    let created = store.create_token(token).await.unwrap();
    assert_eq!(created.user_id, ana.id);
    assert_eq!(created.name.as_deref(), Some("token a"));
    assert_eq!(created.permissions, permissions("runs:read,runs:write"));
    assert_eq!(created.expires_at, Some(rfc3339(expires)));
    assert_eq!(created.last_used_at, None);
    assert_eq!(created.revoked_at, None);

    let found = store.find_token(&digest).await.unwrap().unwrap();
    assert_eq!(found.token, created);
    assert_eq!(found.user, ana);
    assert_eq!(found.refusal(OffsetDateTime::now_utc()), None);
    assert!(found.token.permissions.allows(Permission::RunsRead));
    assert!(!found.token.permissions.allows(Permission::ThreadsRead));

    let other = token_digest(&format!("sf_{}", "b".repeat(43)));
    assert_eq!(store.find_token(&other).await.unwrap(), None);
    assert_eq!(
        store
            .find_token(&format!("sf_{}", "a".repeat(43)))
            .await
            .unwrap(),
        None,
        "the token text itself finds nothing"
    );

    let admin = NewToken {
        name: None,
        ..new_token(&ana.id, 'c', "admin")
    };
    let admin = store.create_token(admin).await.unwrap();
    assert_eq!(admin.name, None);
    assert_eq!(admin.expires_at, None);
    assert_eq!(admin.permissions, Permissions::admin());
    assert_ne!(admin.id, created.id);
}

/// Tokens of unknown users, with a bad digest, a taken digest or no permission are
/// typed errors, and none is stored.
pub async fn auth_invalid_tokens_are_typed_errors_and_write_nothing(store: Arc<dyn Store>) {
    let ana = store.add_user("ana").await.unwrap();
    store
        .create_token(new_token(&ana.id, 'a', "admin"))
        .await
        .unwrap();
    assert!(matches!(
        store.create_token(new_token("no-such-user", 'b', "admin")).await,
        Err(Error::UnknownUser(id)) if id == "no-such-user"
    ));
    assert!(matches!(
        store
            .create_token(new_token(&ana.id, 'a', "runs:read"))
            .await,
        Err(Error::InvalidToken(_))
    ));
    let plain = NewToken {
        digest: format!("sf_{}", "d".repeat(43)),
        ..new_token(&ana.id, 'd', "admin")
    };
    assert!(matches!(
        store.create_token(plain).await,
        Err(Error::InvalidToken(_))
    ));
    let powerless = NewToken {
        permissions: Permissions::default(),
        ..new_token(&ana.id, 'e', "admin")
    };
    let error = store.create_token(powerless).await.unwrap_err();
    assert!(matches!(error, Error::InvalidToken(_)));
    assert!(error.is_invalid_input());
    assert_eq!(store.list_tokens(None).await.unwrap().len(), 1);
}

/// Listing shows every token in creation order, or one user's.
pub async fn auth_tokens_list_in_creation_order_per_user(store: Arc<dyn Store>) {
    let ana = store.add_user("ana").await.unwrap();
    let bo = store.add_user("bo").await.unwrap();
    let mut created = Vec::new();
    for (user, seed) in [(&ana, 'a'), (&bo, 'b'), (&ana, 'c'), (&ana, 'd')] {
        created.push(
            store
                .create_token(new_token(&user.id, seed, "threads:read"))
                .await
                .unwrap(),
        );
    }
    assert_eq!(store.list_tokens(None).await.unwrap(), created);
    assert_eq!(
        ids(&store.list_tokens(Some(&ana.id)).await.unwrap()),
        [&created[0].id, &created[2].id, &created[3].id]
    );
    assert_eq!(
        ids(&store.list_tokens(Some(&bo.id)).await.unwrap()),
        [&created[1].id]
    );
    assert!(store.list_tokens(Some("nobody")).await.unwrap().is_empty());
}

/// Revoking marks the token once, refuses it, and leaves other tokens alone.
pub async fn auth_revoking_keeps_the_first_revocation(store: Arc<dyn Store>) {
    let ana = store.add_user("ana").await.unwrap();
    let token = new_token(&ana.id, 'a', "admin");
    let digest = token.digest.clone();
    let revoked = store.create_token(token).await.unwrap();
    let kept = store
        .create_token(new_token(&ana.id, 'b', "admin"))
        .await
        .unwrap();
    assert!(store.revoke_token(&revoked.id).await.unwrap());
    let first = store.find_token(&digest).await.unwrap().unwrap();
    let revoked_at = first.token.revoked_at.clone().expect("revoked_at is set");
    assert_eq!(
        first.refusal(OffsetDateTime::now_utc()),
        Some(Refusal::Revoked)
    );
    assert!(store.revoke_token(&revoked.id).await.unwrap());
    let again = store.find_token(&digest).await.unwrap().unwrap();
    assert_eq!(again.token.revoked_at, Some(revoked_at));
    assert!(!store.revoke_token("no-such-token").await.unwrap());
    let listed = store.list_tokens(None).await.unwrap();
    assert_eq!(listed[1], kept);
    assert!(listed[0].revoked_at.is_some());
}

/// A token past its `expires_at` is found but refused.
pub async fn auth_expired_tokens_are_refused(store: Arc<dyn Store>) {
    let ana = store.add_user("ana").await.unwrap();
    let past = OffsetDateTime::now_utc() - Duration::from_secs(1);
    let token = NewToken {
        expires_at: Some(past),
        ..new_token(&ana.id, 'a', "admin")
    };
    let digest = token.digest.clone();
    store.create_token(token).await.unwrap();
    let found = store.find_token(&digest).await.unwrap().unwrap();
    assert_eq!(found.token.expires_at, Some(rfc3339(past)));
    assert_eq!(
        found.refusal(OffsetDateTime::now_utc()),
        Some(Refusal::Expired)
    );
    assert_eq!(found.refusal(past - Duration::from_secs(1)), None);
}

/// Disabling a user refuses every one of its tokens, and only its tokens.
pub async fn auth_disabling_a_user_refuses_its_tokens(store: Arc<dyn Store>) {
    let ana = store.add_user("ana").await.unwrap();
    let bo = store.add_user("bo").await.unwrap();
    let of_ana = new_token(&ana.id, 'a', "admin");
    let of_bo = new_token(&bo.id, 'b', "admin");
    let (ana_digest, bo_digest) = (of_ana.digest.clone(), of_bo.digest.clone());
    store.create_token(of_ana).await.unwrap();
    store.create_token(of_bo).await.unwrap();
    assert!(store.disable_user(&ana.id).await.unwrap());
    let now = OffsetDateTime::now_utc();
    let found = store.find_token(&ana_digest).await.unwrap().unwrap();
    assert!(found.user.disabled);
    assert_eq!(found.refusal(now), Some(Refusal::UserDisabled));
    let other = store.find_token(&bo_digest).await.unwrap().unwrap();
    assert_eq!(other.refusal(now), None);
}

/// Touching sets `last_used_at` on that token only; an unknown id is no error.
pub async fn auth_touching_records_the_last_use(store: Arc<dyn Store>) {
    let ana = store.add_user("ana").await.unwrap();
    let token = new_token(&ana.id, 'a', "admin");
    let digest = token.digest.clone();
    let touched = store.create_token(token).await.unwrap();
    let untouched = store
        .create_token(new_token(&ana.id, 'b', "admin"))
        .await
        .unwrap();
    let before = OffsetDateTime::now_utc();
    store.touch_token(&touched.id).await.unwrap();
    store.touch_token("no-such-token").await.unwrap();
    let found = store.find_token(&digest).await.unwrap().unwrap();
    let last_used = found
        .token
        .last_used_at
        .clone()
        .expect("last_used_at is set");
    assert!(last_used >= rfc3339(before - Duration::from_secs(1)));
    assert!(!found.token.needs_touch(OffsetDateTime::now_utc()));
    let listed = store.list_tokens(None).await.unwrap();
    assert_eq!(listed[0].last_used_at, Some(last_used));
    assert_eq!(listed[1], untouched);
}
