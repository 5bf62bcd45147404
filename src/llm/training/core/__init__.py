"""Core training pieces shared by every task: configuration models."""
