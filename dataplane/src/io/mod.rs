//! Drivers: they move frames between the outside world and the sans-IO
//! [`Gateway`](crate::Gateway) and nothing else.

pub mod pcap;
