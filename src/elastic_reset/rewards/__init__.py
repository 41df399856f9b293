"""Reward functions and reward models."""
