//! The one glob matcher under the policy's host labels and HTTP path
//! segments. Its own module because both `engine` and `http` use it, and
//! neither may import the other back (tests/layers.rs).

/// Iterative wildcard matching with one backtrack point: O(len(pat) *
/// len(text)) at worst, no recursion.
pub(super) fn wildcard<T: Copy + PartialEq + From<u8>>(pat: &[u8], text: &[T]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pat.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || T::from(c) == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    star = Some((sp, st + 1));
                    p = sp + 1;
                    t = st + 1;
                }
                None => return false,
            },
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_matcher() {
        assert!(wildcard(b"*", b"".as_slice()));
        assert!(wildcard(b"a*", b"a".as_slice()));
        assert!(wildcard(b"*a*a", b"aaa".as_slice()));
        assert!(!wildcard(b"*a*a", b"a".as_slice()));
        assert!(wildcard(b"a?c", b"abc".as_slice()));
        assert!(!wildcard(b"a?c", b"ac".as_slice()));
    }
}
