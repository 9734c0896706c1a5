//! System tests of the `subflow` binary and the repository rules.

mod cli;
mod config;
mod sdk;
mod tidy;
mod web;
