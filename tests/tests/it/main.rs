//! End-to-end tests, in one binary. Lab tests need root; see kubexm_e2e.

mod build;
mod conformance;
mod day2;
mod day2_etcd;
mod deploy;
mod engine;
mod hostile;
mod jobs;
mod kubernetes;
mod lab;
mod operator;
mod os;
mod security;
mod serve;
mod upgrade;
