//! Test tooling shared by the workspace's test suites (the service's, the lab's): the built
//! binaries run as a user runs them, scratch directories, loopback ports, and the Kubernetes
//! binaries of the loopback control plane. Test code only:
//! no product crate depends on it.

pub mod bins;
pub mod cli;
pub mod port;
