//! A Linux interface's own link settings (MAC address and MTU), read with
//! `SIOCGIFHWADDR` and `SIOCGIFMTU` on a socket of the calling thread's
//! network namespace (unlike `/sys/class/net`, which shows the namespace
//! sysfs was mounted in).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use smoltcp::wire::EthernetAddress;

const ARPHRD_ETHER: u16 = 1;

/// What the kernel says about an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLink {
    /// `None` for a device without an Ethernet address (TUN).
    pub mac: Option<EthernetAddress>,
    /// The device's MTU in bytes: the largest L3 packet it sends, link
    /// header not included (0 if the kernel reported a negative one).
    pub mtu: u32,
}

/// Why an interface's settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The name cannot be a Linux interface's: longer than 15 bytes, or
    /// holding a NUL byte.
    #[error("interface name `{0}` is longer than 15 bytes")]
    Name(String),
    /// The socket to ask on could not be opened, or an ioctl failed
    /// (ENODEV: no such device in this namespace).
    #[error("cannot read the link settings of `{device}`: {source}")]
    Io {
        /// The interface asked about.
        device: String,
        /// The failed call's error.
        #[source]
        source: io::Error,
    },
}

/// Reads `device`'s MAC address and MTU.
pub fn link(device: &str) -> Result<DeviceLink, DeviceError> {
    let io_err = |source| DeviceError::Io {
        device: device.to_owned(),
        source,
    };
    if device.len() >= libc::IFNAMSIZ || device.as_bytes().contains(&0) {
        return Err(DeviceError::Name(device.to_owned()));
    }
    // SAFETY: plain socket(2); owned below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io_err(io::Error::last_os_error()));
    }
    // SAFETY: raw is a fresh descriptor owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let request = || {
        // SAFETY: ifreq is plain data; zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (slot, byte) in req.ifr_name.iter_mut().zip(device.bytes()) {
            *slot = byte as libc::c_char;
        }
        req
    };
    let mut hw = request();
    // SAFETY: SIOCGIFHWADDR reads the name and writes ifru_hwaddr of an
    // ifreq we own.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut hw) } < 0 {
        return Err(io_err(io::Error::last_os_error()));
    }
    // SAFETY: the kernel filled the hwaddr member of the union.
    let addr = unsafe { hw.ifr_ifru.ifru_hwaddr };
    let mac = (addr.sa_family == ARPHRD_ETHER).then(|| {
        let mut m = [0u8; 6];
        for (dst, src) in m.iter_mut().zip(addr.sa_data.iter()) {
            *dst = *src as u8;
        }
        EthernetAddress(m)
    });
    let mut mtu = request();
    // SAFETY: SIOCGIFMTU reads the name and writes ifru_mtu of an ifreq we own.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU, &mut mtu) } < 0 {
        return Err(io_err(io::Error::last_os_error()));
    }
    // SAFETY: the kernel filled the mtu member of the union.
    let mtu = unsafe { mtu.ifr_ifru.ifru_mtu };
    Ok(DeviceLink {
        mac,
        mtu: u32::try_from(mtu).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_no_ethernet_address() {
        let lo = link("lo").expect("every namespace has lo");
        assert_eq!(lo.mac, None);
        assert!(lo.mtu >= 1500);
    }

    #[test]
    fn errors_name_the_device() {
        let e = link("espgw-none0").expect_err("no such device");
        assert!(e.to_string().contains("espgw-none0"), "{e}");
        assert!(matches!(link("a-name-far-too-long"), Err(DeviceError::Name(_))));
    }
}
