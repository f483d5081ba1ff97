//! Scripted-model tests of the support agent.
