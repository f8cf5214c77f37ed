"""Views: pure translators from canonical events to the frames of one surface. No I/O."""
