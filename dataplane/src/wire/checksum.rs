//! The Internet checksum (RFC 1071) and the pseudo-headers that TCP and
//! UDP sum over IPv4 (RFC 793/768) and IPv6 (RFC 8200 §8.1), shared by the
//! core (UDP-encapsulated ESP's checksum, `nat`) and the drivers, which
//! complete, verify and rewrite checksums as they cut and merge segments.
//!
//! Pure arithmetic over byte slices: no state, no allocation. The
//! functions are `#[inline]` because the drivers, another crate, call them
//! per packet.

/// RFC 1071 ones' complement sum of `data` as big-endian 16-bit words
/// (an odd last byte padded with zero), added to `initial`, not folded.
///
/// The sum does not depend on byte order (RFC 1071 §2(B)): the words are
/// summed as they lie in memory, 32 bits at a time into 64 (2^16 ≡ 1 mod
/// 0xffff, so 32-bit words fold to the same value as 16-bit ones), which
/// the compiler vectorizes, and the folded result is put in network order
/// once. This runs over every byte of every TCP segment the driver cuts
/// or merges, so it is worth the care.
#[inline]
pub fn ones_sum(data: &[u8], initial: u64) -> u64 {
    let mut chunks = data.chunks_exact(4);
    let mut native = 0u64;
    for c in &mut chunks {
        native += u64::from(u32::from_ne_bytes([c[0], c[1], c[2], c[3]]));
    }
    while native >> 16 != 0 {
        native = (native & 0xffff) + (native >> 16);
    }
    // `from_be` swaps on a little-endian host and is the identity on a
    // big-endian one: either way the network-order sum.
    let mut acc = initial + u64::from(u16::from_be(native as u16));
    // What is left starts at a multiple of 4: whole 16-bit words, then
    // perhaps one byte.
    let mut words = chunks.remainder().chunks_exact(2);
    for w in &mut words {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// The RFC 793/768 pseudo-header of an IPv4 packet, summed (not folded):
/// its source and destination addresses (`ip_header[12..20]`), protocol
/// and L4 length.
#[inline]
pub fn pseudo_header_sum(ip_header: &[u8], protocol: u8, l4_len: usize) -> u64 {
    ones_sum(&ip_header[12..20], u64::from(protocol) + l4_len as u64)
}

/// Folds a sum to 16 bits and complements it: the checksum to store.
#[inline]
pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// The RFC 8200 §8.1 pseudo-header of an IPv6 packet without extension
/// headers, summed: its addresses (`ip_header[8..40]`), next header and
/// upper-layer length.
#[inline]
pub fn pseudo_header_sum6(ip_header: &[u8], protocol: u8, l4_len: usize) -> u64 {
    ones_sum(&ip_header[8..40], u64::from(protocol) + l4_len as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorizable sum agrees with RFC 1071's word-by-word one for
    /// every length and alignment.
    #[test]
    fn ones_sum_agrees_with_the_word_by_word_definition() {
        let data: Vec<u8> = (0..3000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let naive = |d: &[u8], initial: u64| -> u64 {
            let mut acc = initial;
            for w in d.chunks(2) {
                acc += u64::from(w[0]) << 8 | u64::from(*w.get(1).unwrap_or(&0));
            }
            acc
        };
        for start in 0..8 {
            for len in (0..200).chain([1447, 1448, 1500, 2900]) {
                let d = &data[start..start + len];
                assert_eq!(
                    fold(ones_sum(d, 77)),
                    fold(naive(d, 77)),
                    "start {start} len {len}"
                );
            }
        }
        assert_eq!(fold(ones_sum(&[0xff; 64], 0)), fold(naive(&[0xff; 64], 0)));
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(ones_sum(&data, 0)), !0xddf2);
        // Odd length: the last byte is the high half of a word.
        assert_eq!(fold(ones_sum(&[0x01], 0)), !0x0100);
        assert_eq!(
            fold(ones_sum(&data[..7], 0)),
            fold(ones_sum(&[0, 1, 0xf2, 3, 0xf4, 0xf5, 0xf6, 0], 0))
        );
    }
}
