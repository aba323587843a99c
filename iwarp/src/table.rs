//! A bounded table of objects named by small integer handles.

/// Handles start at 1 so that 0 never names an object.
#[derive(Debug)]
pub struct Table<T> {
    slots: Vec<Option<T>>,
    free: Vec<u32>,
    max: u32,
    live: usize,
}

impl<T> Table<T> {
    pub fn new(max: u32) -> Self {
        Self { slots: Vec::new(), free: Vec::new(), max, live: 0 }
    }

    /// Stores `value`; `None` when the table is full.
    pub fn insert(&mut self, value: T) -> Option<u32> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len()).ok().filter(|&i| i < self.max)?;
                self.slots.push(None);
                i
            }
        };
        *self.slots.get_mut(index as usize)? = Some(value);
        self.live += 1;
        Some(index + 1)
    }

    pub fn get(&self, handle: u32) -> Option<&T> {
        let i = handle.checked_sub(1)? as usize;
        self.slots.get(i)?.as_ref()
    }

    pub fn get_mut(&mut self, handle: u32) -> Option<&mut T> {
        let i = handle.checked_sub(1)? as usize;
        self.slots.get_mut(i)?.as_mut()
    }

    pub fn remove(&mut self, handle: u32) -> Option<T> {
        let i = handle.checked_sub(1)?;
        let value = self.slots.get_mut(i as usize)?.take()?;
        self.free.push(i);
        self.live -= 1;
        Some(value)
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots.iter().zip(1u32..).filter_map(|(slot, handle)| slot.as_ref().map(|v| (handle, v)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.slots.iter_mut().zip(1u32..).filter_map(|(slot, handle)| slot.as_mut().map(|v| (handle, v)))
    }

    pub fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
        self.live = 0;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_reuses_handles() {
        let mut t = Table::new(2);
        let a = t.insert("a").unwrap();
        let b = t.insert("b").unwrap();
        assert_eq!((a, b), (1, 2));
        assert_eq!(t.insert("c"), None);
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!(t.remove(a), None);
        assert_eq!(t.insert("d"), Some(1));
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn bogus_handles_find_nothing() {
        let mut t: Table<u8> = Table::new(4);
        t.insert(1).unwrap();
        for h in [0, 2, 5, u32::MAX] {
            assert!(t.get(h).is_none());
            assert!(t.get_mut(h).is_none());
            assert!(t.remove(h).is_none());
        }
    }
}
