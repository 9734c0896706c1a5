//! `subflow version`.

/// The version of `contracts/subagent_status_contract.json`.
pub const STATUS_CONTRACT_VERSION: u32 = 2;
/// The version of `contracts/run_event_stream_contract.json`.
pub const EVENT_CONTRACT_VERSION: u32 = 1;

/// Prints the binary and contract versions.
pub fn run() -> anyhow::Result<()> {
    outln!(
        "subflow {} (subagent status contract v{STATUS_CONTRACT_VERSION}, run event stream contract v{EVENT_CONTRACT_VERSION})",
        env!("CARGO_PKG_VERSION")
    )?;
    Ok(())
}
