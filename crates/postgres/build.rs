//! Rebuilds the crate when a migration changes, so `sqlx::migrate!` embeds the
//! current set.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
