//! A heap box whose bytes are overwritten with zeros when it is dropped.
//!
//! `ring` key types hold their expanded keys inline and do not zeroize
//! themselves; boxing them here makes sure an SA's key schedule does not
//! outlive the SA in freed memory.

use std::mem::{size_of, ManuallyDrop};
use std::ops::Deref;

use zeroize::Zeroize;

pub(crate) struct Wiped<T> {
    inner: Box<ManuallyDrop<T>>,
}

impl<T> Wiped<T> {
    pub(crate) fn new(value: T) -> Self {
        Wiped {
            inner: Box::new(ManuallyDrop::new(value)),
        }
    }
}

impl<T> Deref for Wiped<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T> Drop for Wiped<T> {
    fn drop(&mut self) {
        let slot: &mut ManuallyDrop<T> = &mut self.inner;
        // SAFETY: the value is dropped exactly once, here; afterwards its
        // storage is plain bytes owned by the box until the box frees it,
        // so overwriting them is sound. Zeroize uses volatile writes.
        unsafe {
            ManuallyDrop::drop(slot);
            let bytes =
                std::slice::from_raw_parts_mut((slot as *mut ManuallyDrop<T>).cast::<u8>(), size_of::<T>());
            bytes.zeroize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derefs_to_value_and_drops_inner() {
        use std::rc::Rc;
        let shared = Rc::new(5u32);
        let wiped = Wiped::new(Rc::clone(&shared));
        assert_eq!(**wiped, 5);
        assert_eq!(Rc::strong_count(&shared), 2);
        drop(wiped);
        assert_eq!(Rc::strong_count(&shared), 1);
    }
}
