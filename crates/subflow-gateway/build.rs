//! Rebuilds the gateway whenever anything under `web/assets` changes, so the embedded web
//! workspace (`rust-embed`) also picks up added and removed files, not only edited ones.

fn main() {
    println!("cargo:rerun-if-changed=../../web/assets");
}
