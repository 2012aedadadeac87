//! Inputs that once crashed a fuzz target (`fuzz/`), kept as tests in the
//! crate that owns the code.

use ike_stub::plane::udp_payload;

/// A 28-byte IPv4/UDP packet whose total length (22) ends inside the UDP
/// header: `udp_payload` indexed the UDP length field past the end of the
/// packet it had cut to the total length (the `control_plane` fuzz target's
/// crash: total length 0, "index out of bounds: the len is 0 but the index
/// is 12" in `ControlPlane::handle_datagram`).
#[test]
fn udp_payload_total_length_inside_the_udp_header() {
    let mut packet = [0u8; 28];
    packet[0] = 0x45;
    packet[9] = 17;
    for total in 0..28u16 {
        packet[2..4].copy_from_slice(&total.to_be_bytes());
        assert_eq!(udp_payload(&packet), None, "total length {total}");
    }
    // Consistent lengths still give the payload.
    packet[2..4].copy_from_slice(&28u16.to_be_bytes());
    packet[24..26].copy_from_slice(&8u16.to_be_bytes());
    assert_eq!(udp_payload(&packet).map(|(_, _, p)| p.len()), Some(0));
}
