//! Test support, built only with the `test-utils` feature: the one
//! synthetic guest that vt3d's device tests, fuzz targets and device
//! bench drive. [`ram`] is guest memory with vt3.ko's layout and libvt3's
//! rings; [`guest`] is the driver over it, with commands carried by a
//! [`guest::DriverPath`]; [`local`] is the path to a device in this
//! process, in the simulation's virtual time.

pub mod guest;
pub mod local;
pub mod ram;

pub use guest::{accept_args, connect_args, listen_args, private_data, sockaddr, DriverPath, Events, Guest};
pub use local::{local_layout, Local};
pub use ram::{rdma_wqe, recv_wqe, send_wqe, CqRing, GuestRam, Layout, Mr, QpCaps, QpRings, SrqRing};
