//! The integration tests of espgw's library crates (`accel`, `dataplane`,
//! `drivers`, `ike-stub`, `spd-sad`) working together, in `tests/`: two
//! gateways joined in memory, every engine, the control plane, key memory,
//! the fuzz targets' seeds. None runs the `espgw` binary or uses its own
//! modules; those tests stay in the root crate's `tests/`. This library is
//! empty: it owns nothing and nothing may depend on it.
