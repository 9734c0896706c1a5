//! System tests of the `subflow` binary and the repository rules.

mod admin;
mod cli;
mod config;
mod sdk;
mod tidy;
mod web;
