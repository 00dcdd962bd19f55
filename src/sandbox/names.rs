//! Generated sandbox names: `adjective-noun`, like `red-fox`, short enough
//! to type and to fit in machine and interface names.

/// Adjectives and nouns, lowercase ASCII; 48 × 48 = 2304 names.
const ADJECTIVES: &[&str] = &[
    "amber", "bold", "brave", "bright", "brisk", "calm", "clever", "cosmic", "crisp", "curly", "dandy", "eager",
    "fancy", "fast", "fluffy", "gentle", "glad", "golden", "happy", "hasty", "jolly", "keen", "kind", "lucky", "lunar",
    "mellow", "merry", "mighty", "misty", "noble", "plucky", "polar", "proud", "quick", "quiet", "rapid", "red",
    "rosy", "rusty", "shiny", "silent", "silver", "snappy", "solar", "sunny", "swift", "tidy", "witty",
];
const NOUNS: &[&str] = &[
    "badger", "bear", "beaver", "bee", "bird", "bison", "cat", "cobra", "crane", "crow", "deer", "dingo", "dove",
    "eagle", "falcon", "ferret", "finch", "fox", "frog", "gecko", "goose", "hare", "hawk", "heron", "ibis", "koala",
    "lark", "lemur", "lion", "llama", "lynx", "mole", "moose", "newt", "otter", "owl", "panda", "puffin", "quail",
    "raven", "robin", "seal", "shrew", "swan", "tiger", "toad", "wolf", "yak",
];

/// The `n`-th name of the sequence, for `n` from a random source.
pub fn nth(index: u64) -> String {
    let adjectives = ADJECTIVES.len() as u64;
    let nouns = NOUNS.len() as u64;
    let adjective = usize::try_from(index % adjectives).unwrap_or(0);
    let noun = usize::try_from((index / adjectives) % nouns).unwrap_or(0);
    format!("{}-{}", ADJECTIVES[adjective], NOUNS[noun])
}

/// A random name not rejected by `taken`, or `None` when 64 tries all
/// were (a pool this full means the user should pick a name).
pub fn generate(mut taken: impl FnMut(&str) -> bool) -> Option<String> {
    (0..64).map(|_| nth(random())).find(|n| !taken(n))
}

fn random() -> u64 {
    let b = uuid::Uuid::new_v4().into_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_and_varied() {
        let all: std::collections::BTreeSet<String> = (0..(48 * 48)).map(nth).collect();
        assert_eq!(all.len(), 48 * 48, "every index gives a distinct name");
        for n in &all {
            super::super::validate_name(n).unwrap();
        }
        assert_eq!(generate(|_| true), None);
        let got = generate(|n| n.starts_with('a')).unwrap();
        assert!(!got.starts_with('a'));
    }
}
