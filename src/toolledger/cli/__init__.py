"""The ``toolledger`` command line (``toolledger.cli.app:main``). All printing lives in this
package; importing it loads nothing, so the library's own use of its prompts stays light."""
