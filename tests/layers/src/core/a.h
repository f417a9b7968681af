// fine
