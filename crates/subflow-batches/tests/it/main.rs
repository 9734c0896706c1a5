//! The batch worker against real stores (the memory store and a SQLite file) with the
//! scripted model, driven step by step on paused time.

mod faults;
mod harness;
mod worker;
