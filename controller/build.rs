//! Rebuilds the controller when a migration is added to or removed from
//! `migrations/`, which sqlx's `migrate!` embeds (it tracks the files it read, not the
//! directory).

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
