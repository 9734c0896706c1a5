//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds the
//! `migrations` directory, which Cargo does not otherwise watch.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
