//! End-to-end tests of the real `tollgate` binary, started on port 0: the walk
//! on both stores, startup configuration, migrate and check, several servers
//! on one database, shutdown, and the walkthrough document.

mod connections;
mod docs;
mod faults;
mod load;
mod memory;
mod postgres;
mod remote;
mod startup;
mod support;
mod walk;
mod walkthrough;
mod webhooks;
