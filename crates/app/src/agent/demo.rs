//! The support agent's scene of `parlance demo`.
