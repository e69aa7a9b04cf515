"""Statements that write what a job leaves besides its state: outputs, events, learning rows, labels."""
