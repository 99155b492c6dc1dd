//! What a request used: its tokens. Quotas count it, models price it, the log keeps it; the
//! upstream module reads it from a provider's answer and checks it (`provider::usage`).

/// Tokens of one call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt (input) tokens, cache reads and writes included.
    pub prompt: u64,
    /// Completion (output) tokens.
    pub completion: u64,
}

impl Usage {
    /// Prompt plus completion.
    pub fn total(self) -> u64 {
        self.prompt.saturating_add(self.completion)
    }

    /// This usage held to `ceiling` tokens in all, the prompt kept first.
    pub fn capped(self, ceiling: u64) -> Usage {
        let prompt = self.prompt.min(ceiling);
        Usage {
            prompt,
            completion: self.completion.min(ceiling - prompt),
        }
    }
}
