//! Guards that stop an agent before it runs away (SPEC §10).
