"""Test doubles that speak real protocols (HTTP), so the code under test is not patched."""
