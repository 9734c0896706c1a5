//! System tests of the `subflow` binary and the repository rules.

mod admin;
mod batch_commands;
mod batches;
mod budgets;
mod cli;
mod client;
mod config;
mod connections;
mod crash;
mod full_disk;
mod memory;
mod recovery;
mod sdk;
mod tidy;
mod web;
