//! System tests of the runtime without HTTP: real stores, the scripted model, the
//! live output stream and the persisted run events.

mod batch_tools;
mod demo;
mod detached;
mod harness;
mod lifecycle;
mod loops;
mod observers;
mod paths;
