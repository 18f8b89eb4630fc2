//! `InlineList`: a short list kept on the stack, spilling to the heap only
//! past `N` items.
//!
//! The launch paths (prepare, finish, free) collect a few events or streams
//! per call; a `Vec` there would cost an allocation per call once anything
//! is pushed. Items are `Copy`, so moving them to the heap on the first
//! overflow is a plain copy.

pub struct InlineList<T: Copy + Default, const N: usize> {
    len: usize,
    inline: [T; N],
    spill: Vec<T>,
}

impl<T: Copy + Default, const N: usize> Default for InlineList<T, N> {
    fn default() -> Self {
        InlineList { len: 0, inline: [T::default(); N], spill: Vec::new() }
    }
}

impl<T: Copy + Default, const N: usize> InlineList<T, N> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, item: T) {
        if self.len < N {
            self.inline[self.len] = item;
        } else {
            if self.len == N {
                self.spill.reserve(2 * N);
                self.spill.extend_from_slice(&self.inline);
            }
            self.spill.push(item);
        }
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[T] {
        if self.len <= N {
            &self.inline[..self.len]
        } else {
            &self.spill
        }
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        if self.len <= N {
            &mut self.inline[..self.len]
        } else {
            &mut self.spill
        }
    }

    /// Whether `item` is in the list.
    pub fn contains(&self, item: &T) -> bool
    where
        T: PartialEq,
    {
        self.as_slice().contains(item)
    }

    /// Sort and drop repeated items.
    pub fn sort_dedup(&mut self)
    where
        T: Ord,
    {
        if self.len < 2 {
            return;
        }
        let items = self.as_mut_slice();
        items.sort_unstable();
        let mut kept = 1;
        for i in 1..items.len() {
            if items[i] != items[kept - 1] {
                items[kept] = items[i];
                kept += 1;
            }
        }
        if self.len > N {
            self.spill.truncate(kept);
            if kept <= N {
                self.inline[..kept].copy_from_slice(&self.spill);
                self.spill.clear();
            }
        }
        self.len = kept;
    }
}

#[cfg(test)]
mod tests {
    use super::InlineList;

    #[test]
    fn stays_inline_then_spills_and_keeps_order() {
        let mut l: InlineList<u32, 4> = InlineList::new();
        for i in 0..4 {
            l.push(i);
        }
        assert_eq!(l.as_slice(), &[0, 1, 2, 3]);
        assert!(l.spill.capacity() == 0, "no heap use up to N items");
        for i in 4..10 {
            l.push(i);
        }
        assert_eq!(l.as_slice(), &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(l.len(), 10);
    }

    #[test]
    fn sort_dedup_inline_and_spilled() {
        let mut l: InlineList<u32, 4> = InlineList::new();
        for i in [3, 1, 3, 1] {
            l.push(i);
        }
        l.sort_dedup();
        assert_eq!(l.as_slice(), &[1, 3]);
        let mut l: InlineList<u32, 4> = InlineList::new();
        for i in [5, 2, 5, 2, 9, 2, 5] {
            l.push(i);
        }
        l.sort_dedup();
        assert_eq!(l.as_slice(), &[2, 5, 9]);
        l.push(1);
        assert_eq!(l.as_slice(), &[2, 5, 9, 1]);
        assert!(l.contains(&9) && !l.contains(&7));
    }
}
